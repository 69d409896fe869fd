// The ziggurat normal generator of random.h (Marsaglia & Tsang, "The
// Ziggurat Method for Generating Random Variables", JSS 2000: 128 layers,
// 32-bit abscissae), with the layer index drawn from bits disjoint from the
// abscissa.
#include "sim/random.h"

#include <cmath>

namespace attnaudit::sim_internal {
namespace {

constexpr int kLayers = 128;
constexpr double kR = 3.442619855899;          // start of the tail
constexpr double kArea = 9.91256303526217e-3;  // area of each layer
constexpr double kTwo31 = 2147483648.0;

struct ZigguratTables {
  uint32_t k[kLayers];  // fast-accept thresholds on |hz|
  double w[kLayers];    // x_i / 2^31
  double f[kLayers];    // exp(-x_i^2 / 2)
  ZigguratTables() {
    double dn = kR;
    double tn = dn;
    const double q = kArea / std::exp(-0.5 * dn * dn);
    k[0] = static_cast<uint32_t>((dn / q) * kTwo31);
    k[1] = 0;
    w[0] = q / kTwo31;
    w[kLayers - 1] = dn / kTwo31;
    f[0] = 1.0;
    f[kLayers - 1] = std::exp(-0.5 * dn * dn);
    for (int i = kLayers - 2; i >= 1; --i) {
      dn = std::sqrt(-2.0 * std::log(kArea / dn + std::exp(-0.5 * dn * dn)));
      k[i + 1] = static_cast<uint32_t>((dn / tn) * kTwo31);
      tn = dn;
      f[i] = std::exp(-0.5 * dn * dn);
      w[i] = dn / kTwo31;
    }
  }
};

const ZigguratTables& Tables() {
  static const ZigguratTables* tables = new ZigguratTables();
  return *tables;
}

}  // namespace

double NormalSource::Normal() {
  const ZigguratTables& t = Tables();
  for (;;) {
    const uint64_t bits = engine_();
    const int32_t hz = static_cast<int32_t>(static_cast<uint32_t>(bits));
    const int iz = static_cast<int>((bits >> 32) & (kLayers - 1));
    const uint32_t magnitude =
        hz < 0 ? static_cast<uint32_t>(-static_cast<int64_t>(hz))
               : static_cast<uint32_t>(hz);
    const double x = hz * t.w[iz];
    if (magnitude < t.k[iz]) return x;  // inside the layer's rectangle
    if (iz == 0) return Tail(hz < 0);
    // The wedge between the rectangle and the density.
    if (t.f[iz] + Uniform() * (t.f[iz - 1] - t.f[iz]) <
        std::exp(-0.5 * x * x)) {
      return x;
    }
  }
}

// Marsaglia's tail method for |x| > kR.
double NormalSource::Tail(bool negative) {
  double x, y;
  do {
    x = -std::log(1.0 - Uniform()) / kR;
    y = -std::log(1.0 - Uniform());
  } while (y + y < x * x);
  return negative ? -(kR + x) : kR + x;
}

}  // namespace attnaudit::sim_internal
