// C++: managed memory shared by std::threads, with std::vector of pointers.
#include <attune.h>
#include <thread>
#include <vector>
#include <cstdint>
#include <cstdio>
#include <atomic>

int main() {
    const size_t n = 40u << 20, words = n / 8;
    auto *a = static_cast<uint64_t *>(allocate_TM(n, ATTUNE_BW));
    if (!a) { std::printf("alloc failed: %s\n", attune_last_error()); return 1; }
    std::vector<std::thread> ts;
    const int T = 4;
    for (int t = 0; t < T; t++)
        ts.emplace_back([=] { for (size_t i = t; i < words; i += T) a[i] = i * 31 + 7; });
    for (auto &t : ts) t.join();
    std::atomic<uint64_t> bad{0};
    ts.clear();
    for (int t = 0; t < T; t++)
        ts.emplace_back([&, t] { uint64_t b = 0; for (size_t i = t; i < words; i += T) b += a[i] != i * 31 + 7; bad += b; });
    for (auto &t : ts) t.join();
    std::vector<void *> small;
    for (int i = 0; i < 1000; i++) small.push_back(allocate_TM(48, ATTUNE_LAT));
    for (void *p : small) free_TM(p);
    free_TM(a);
    if (bad) { std::printf("%lu bad words\n", (unsigned long)bad.load()); return 1; }
    return 0;
}
