// Deterministic random numbers for the engine simulator (internal).
//
// Reproducibility across standard libraries: std::mt19937_64's output for a
// given integer seed is fixed by the C++ standard, but the distributions in
// <random> (std::normal_distribution, std::uniform_real_distribution) are
// implementation-defined and differ between libstdc++ and libc++ versions.
// So only the raw engine is used: uniforms come from its top 53 bits and
// normals from our own ziggurat (Marsaglia & Tsang 2000, 128 layers; the
// layer index and the 32-bit abscissa come from disjoint bits of one 64-bit
// draw, which avoids the original's correlation). The ziggurat needs about
// one engine draw per normal, which keeps W1 (67 M values) fast. The only
// remaining platform dependence is libm's exp/log in the table setup and the
// rare tail/wedge path (correctly rounded in practice on glibc); results are
// rounded to float or narrower anyway.
//
// Streams are independent per purpose: DeriveSeed mixes the user seed with
// tags (row, token, page, ...) through SplitMix64 so that every token's
// content depends only on (seed, its stream tag, its logical index), never
// on thread scheduling or on what else was generated. Not thread-safe (one
// NormalSource per thread / work item).
#ifndef ATTNAUDIT_SIM_RANDOM_H_
#define ATTNAUDIT_SIM_RANDOM_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>

namespace attnaudit::sim_internal {

// SplitMix64 finaliser: a bijective 64-bit mixer.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Seed of the stream identified by `seed` and a list of tags.
inline uint64_t DeriveSeed(uint64_t seed,
                           std::initializer_list<uint64_t> tags) {
  uint64_t h = Mix64(seed);
  for (uint64_t t : tags) h = Mix64(h ^ Mix64(t + 0x632be59bd9b4e019ULL));
  return h;
}

// Stream tags (arbitrary distinct constants).
enum StreamTag : uint64_t {
  kTagToken = 1,     // K/V content of a logical token
  kTagShared = 2,    // ... of a token in the shared prefix (all rows)
  kTagQuery = 3,     // q of one (row, query)
  kTagHeads = 4,     // per-head structure (directions, strengths, sinks)
  kTagHeavy = 5,     // which tokens are heavy keys
  kTagGarbage = 6,   // content of inactive slots (previous occupant)
  kTagStale = 7,     // the outdated content a stale page still holds
  kTagPermute = 8,   // page permutation
  kTagLmHead = 9,    // lm_head weights
  kTagTokens = 10,   // selected token ids
  kTagCpFault = 11,  // which rank a CP fault hits
  kTagSink = 12,     // the sink's share of one (row, query, head)
};

class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : engine_(seed) {}

  uint64_t Bits() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() {
    return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0);
  }
  // Uniform integer in [0, n), n > 0 (Lemire-free modulo; the bias is
  // below 2^-40 for the n used here and irrelevant for synthetic data).
  uint64_t Below(uint64_t n) { return engine_() % n; }
  // Standard normal (ziggurat), as double.
  double Normal();
  float NormalF() { return static_cast<float>(Normal()); }

 private:
  double Tail(bool negative);

  std::mt19937_64 engine_;
};

}  // namespace attnaudit::sim_internal

#endif  // ATTNAUDIT_SIM_RANDOM_H_
