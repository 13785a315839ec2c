// Communicator semantics: the single-rank implementation here, the MPI one in ranks that
// this test starts under mpirun (the DISABLED_ tests below run only there).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "infera/base/error.h"
#include "infera/parallel/communicator.h"
#include "infera/parallel/launch.h"
#include "infera/parallel/plan.h"

namespace infera::parallel {
namespace {

namespace fs = std::filesystem;

TEST(SplitRange, CoversEveryItemOnceWithSizesWithinOne) {
  for (int64_t n : {0, 1, 7, 8, 512, 1001}) {
    for (int parts : {1, 2, 3, 4, 8}) {
      int64_t next = 0, lo = n, hi = 0;
      for (int p = 0; p < parts; ++p) {
        const Range r = split_range(n, parts, p);
        EXPECT_EQ(r.begin, next) << n << " " << parts << " " << p;
        next = r.end;
        lo = std::min(lo, r.size());
        hi = std::max(hi, r.size());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

TEST(ParallelPlan, RejectsSizesThatDoNotMatchTheGroup) {
  auto comm = make_single_communicator();
  ParallelPlan plan;
  plan.comm = comm.get();
  EXPECT_NO_THROW(validate_plan(plan));
  plan.tp = 2;
  EXPECT_THROW(validate_plan(plan), Error);  // one rank cannot hold tp 2
}

TEST(SingleCommunicator, CollectivesAreCopiesAndAreCounted) {
  auto comm = make_single_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.0f};
  comm->all_reduce_sum(x.data(), 3);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.0f}));
  int32_t send[2] = {7, 9}, recv[2] = {0, 0};
  comm->all_gather(send, sizeof(send), recv);
  EXPECT_EQ(recv[1], 9);
  recv[0] = recv[1] = 0;
  comm->gather(send, sizeof(send), recv, 0);
  EXPECT_EQ(recv[0], 7);
  const int64_t sb[1] = {8}, rb[1] = {8};
  recv[0] = recv[1] = 0;
  comm->all_to_all(send, sb, recv, rb);
  EXPECT_EQ(recv[1], 9);
  comm->broadcast(send, sizeof(send), 0);
  comm->barrier();
  const CommStats& st = comm->stats();
  EXPECT_EQ(st[Collective::kAllReduce].calls, 1);
  EXPECT_EQ(st[Collective::kAllReduce].bytes, 12);
  EXPECT_EQ(st[Collective::kAllGather].bytes, 8);
  EXPECT_EQ(st[Collective::kAllToAll].bytes, 0);  // nothing leaves the rank
  EXPECT_EQ(st.calls(), 6);
  comm->reset_stats();
  EXPECT_EQ(comm->stats().calls(), 0);
}

TEST(ModelFingerprint, ChangesWithConfigOrShardSizes) {
  const fs::path dir = fs::temp_directory_path() / ("infera_fp_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "llama"})";
  std::ofstream(dir / "model.safetensors") << std::string(100, 'x');
  const uint64_t a = model_files_fingerprint(dir.string());
  EXPECT_EQ(a, model_files_fingerprint(dir.string()));
  std::ofstream(dir / "model.safetensors") << std::string(101, 'x');
  const uint64_t b = model_files_fingerprint(dir.string());
  EXPECT_NE(a, b);
  std::ofstream(dir / "config.json") << R"({"model_type": "qwen3"})";
  EXPECT_NE(b, model_files_fingerprint(dir.string()));
  // A GGUF file: its name and size (no config.json beside it).
  std::ofstream(dir / "model.gguf") << std::string(100, 'g');
  const uint64_t g = model_files_fingerprint((dir / "model.gguf").string());
  EXPECT_EQ(g, model_files_fingerprint((dir / "model.gguf").string()));
  std::ofstream(dir / "model.gguf") << std::string(101, 'g');
  EXPECT_NE(g, model_files_fingerprint((dir / "model.gguf").string()));
  // A split GGUF: every part the caller lists counts (a rank whose second part differs).
  const fs::path first = dir / "m-00001-of-00002.gguf", second = dir / "m-00002-of-00002.gguf";
  std::ofstream(first) << std::string(64, 'x');
  std::ofstream(second) << std::string(64, 'y');
  const std::vector<std::string> parts = {first.string(), second.string()};
  const uint64_t split = model_files_fingerprint(first.string(), parts);
  EXPECT_NE(split, model_files_fingerprint(first.string()));
  std::ofstream(second) << std::string(65, 'y');
  EXPECT_NE(split, model_files_fingerprint(first.string(), parts));
  fs::remove_all(dir);
  EXPECT_THROW(model_files_fingerprint(dir.string()), Error);
}

// ---- MPI: the tests below run inside `mpirun -np 3 test_parallel` ----

TEST(MpiRanks, DISABLED_CollectivesAgreeAcrossRanks) {
  auto comm = make_mpi_communicator();
  const int r = comm->rank(), n = comm->size();
  ASSERT_EQ(n, 3);
  // all_reduce: Σ_r (r + 1) * (i + 1)
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((r + 1) * (i + 1));
  comm->all_reduce_sum(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(x[i], 6.0f * (i + 1));
  // all_gather / gather in rank order
  const int32_t mine[2] = {r, 10 * r};
  std::vector<int32_t> all(2 * n, -1);
  comm->all_gather(mine, sizeof(mine), all.data());
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[2 * i + 1], 10 * i);
  std::fill(all.begin(), all.end(), -1);
  comm->gather(mine, sizeof(mine), r == 1 ? all.data() : nullptr, 1);
  if (r == 1) {
    EXPECT_EQ(all[4], 2);
  }
  // broadcast from rank 2
  int64_t value = r == 2 ? 424242 : 0;
  comm->broadcast(&value, sizeof(value), 2);
  EXPECT_EQ(value, 424242);
  // all_to_all: rank r sends (d + 1) ints of value 100 r + d to rank d
  std::vector<int64_t> sb(n), rb(n);
  std::vector<int32_t> send;
  for (int d = 0; d < n; ++d) {
    sb[d] = (d + 1) * 4;
    rb[d] = (r + 1) * 4;
    for (int k = 0; k <= d; ++k) send.push_back(100 * r + d);
  }
  std::vector<int32_t> recv((r + 1) * n, -1);
  comm->all_to_all(send.data(), sb.data(), recv.data(), rb.data());
  for (int s = 0; s < n; ++s) {
    for (int k = 0; k <= r; ++k) EXPECT_EQ(recv[s * (r + 1) + k], 100 * s + r);
  }
  comm->barrier();
  EXPECT_EQ(comm->stats().calls(), 6);
  comm->finalize();
}

TEST(MpiCommunicator, ThreeRanksOverLoopback) {
  if (!mpi_available()) GTEST_SKIP() << "built without MPI";
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  const std::string out = (fs::temp_directory_path() / ("infera_mpi_" + std::to_string(::getpid()))).string();
  // A private OpenMPI session directory (see tp_run_test.cpp: concurrent mpiruns race).
  const fs::path session = out + ".ompi";
  fs::create_directories(session);
  ::setenv("OMPI_MCA_orte_tmpdir_base", session.c_str(), /*overwrite=*/1);
  const std::string cmd = "mpirun --oversubscribe --bind-to none --allow-run-as-root -np 3 " + self +
                          " --gtest_color=no --gtest_also_run_disabled_tests --gtest_filter=MpiRanks.* > " + out +
                          " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::remove(out);
  fs::remove_all(session);
  ::unsetenv("OMPI_MCA_orte_tmpdir_base");  // later tests' mpiruns must not look for it
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << text;
  EXPECT_NE(text.find("[  PASSED  ] 1 test"), std::string::npos) << text;
}

}  // namespace
}  // namespace infera::parallel
