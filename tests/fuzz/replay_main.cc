// A main() for the fuzz targets without libFuzzer: runs
// LLVMFuzzerTestOneInput once on every file named on the command line or
// found in a directory named there (not recursive). The GCC build uses it
// to replay the seed corpus and every crash ever found
// (tests/fuzz/regressions) as ordinary tests; the libFuzzer build runs the
// same targets under ASan and UBSan.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> Inputs(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> files;
  if (DIR* d = opendir(path.c_str())) {
    while (const dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      files.push_back(path + "/" + e->d_name);
    }
    closedir(d);
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  int ran = 0;
  for (int i = 1; i < argc; ++i) {
    for (const std::string& file : Inputs(argv[i])) {
      std::ifstream in(file, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                             bytes.size());
      ++ran;
    }
  }
  std::printf("replayed %d input(s)\n", ran);
  return ran > 0 ? 0 : 1;
}
