// attune run test: std::vector and std::thread, no Attune API. Each thread grows its own
// vector by push_back (reallocation through operator new/delete -> malloc/free) and
// verifies it; then all threads read one shared vector. Usage: cpp_vectors MiB threads
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <atomic>

static uint64_t mix(uint64_t x) { x ^= x >> 31; x *= 0x9E3779B97F4A7C15ull; return x ^ (x >> 29); }

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 128;
  int nt = argc > 2 ? std::atoi(argv[2]) : 4;
  size_t per = (mib << 20) / 8 / (nt + 1);
  std::atomic<int> bad{0};
  std::vector<uint64_t> shared(per);
  for (size_t i = 0; i < per; i++) shared[i] = mix(i);
  std::vector<std::thread> ts;
  for (int t = 0; t < nt; t++)
    ts.emplace_back([&, t] {
      std::vector<uint64_t> v;
      for (size_t i = 0; i < per; i++) v.push_back(mix(i ^ (uint64_t(t) << 40)));
      uint64_t s = t + 1;
      for (size_t k = 0; k < 20000; k++) {
        s = mix(s);
        size_t i = s % per;
        if (v[i] != mix(i ^ (uint64_t(t) << 40)) || shared[i] != mix(i)) { bad++; return; }
      }
    });
  for (auto &t : ts) t.join();
  std::printf("cpp_vectors: %s\n", bad ? "BAD" : "OK");
  return bad ? 1 : 0;
}
