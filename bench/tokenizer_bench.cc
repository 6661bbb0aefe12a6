// tokenizer_bench: load time of each tokenizer.json and single-thread Encode throughput on a
// text file (best of N runs). Load is wall-clock time (it may use several threads); encode is
// the calling thread's CPU time (Encode runs on one core), robust to other processes. Usage:
//   tokenizer_bench --text FILE [--runs 3] DIR...
// where each DIR holds tokenizer.json (+ tokenizer_config.json). Prints one line per DIR.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/flags.h"
#include "util/mapped_file.h"

namespace {

// Thread CPU time: what one core spent, robust to other processes sharing the machine.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string text_path;
  int64_t runs = 3;
  ember::FlagParser flags("tokenizer_bench --text FILE [--runs N] DIR...");
  flags.AddString("--text", &text_path, "UTF-8 text to encode");
  flags.AddInt("--runs", &runs, "encode runs per tokenizer (best is reported)");
  std::vector<std::string> dirs;
  std::vector<char*> flag_args = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0) {
      flag_args.push_back(argv[i]);
      if (i + 1 < argc && a != "--help") flag_args.push_back(argv[++i]);
    } else {
      dirs.push_back(a);
    }
  }
  bool help = false;
  ember::Status st = flags.Parse(int(flag_args.size()), flag_args.data(), 1, &help);
  if (!st.ok() || help || dirs.empty()) {
    std::fprintf(stderr, "%s%s\n", st.ok() ? "" : (st.message() + "\n").c_str(), flags.Help().c_str());
    return help ? 0 : 2;
  }
  std::string text;
  if (!text_path.empty()) {
    auto t = ember::ReadFileToString(text_path);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.message().c_str());
      return 1;
    }
    text = std::move(*t);
  }
  for (const std::string& dir : dirs) {
    auto t0 = std::chrono::steady_clock::now();
    auto tok = ember::Tokenizer::Load(dir);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", tok.message().c_str());
      return 1;
    }
    double best = 1e30;
    size_t num_ids = 0;
    for (int64_t r = 0; r < runs && !text.empty(); ++r) {
      double t1 = CpuSeconds();
      std::vector<int32_t> ids = (*tok)->Encode(text, false);
      best = std::min(best, CpuSeconds() - t1);
      num_ids = ids.size();
    }
    std::printf("%-40s load %7.1f ms (wall)", dir.c_str(), load_s * 1e3);
    if (!text.empty()) {
      std::printf("  encode %.2f MB in %7.1f ms cpu = %6.2f MB/s (%zu ids, best of %lld)",
                  double(text.size()) / 1e6, best * 1e3, double(text.size()) / 1e6 / best,
                  num_ids, static_cast<long long>(runs));
    }
    std::printf("\n");
  }
  return 0;
}
