// MPI communicator over MPI_COMM_WORLD (OpenMPI from Debian; any MPI-3 library works).
//
// Failure model: MPI errors are returned (MPI_ERRORS_RETURN) and become infera::Error
// naming the rank and the call. A rank that dies (signal, OOM kill, exit without
// MPI_Finalize) is noticed by mpirun, which kills the remaining ranks and reports
// "process rank N ... exited on signal S"; a rank that hangs (a host that stops answering)
// is caught by the watchdog: a collective that waits past the limit prints which rank and
// which collective and exits non-zero, which mpirun then turns into the end of the group.
#include "infera/parallel/communicator.h"

#include "infera/base/error.h"

#ifdef INFERA_HAVE_MPI

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

namespace infera::parallel {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int to_int(int64_t n, const char* what) {
  if (n < 0 || n > INT_MAX) fail("{}: message of {} bytes exceeds what one MPI call carries (2 GiB)", what, n);
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // One thread calls MPI at a time, but not always the same one: a server checks the
      // model files on its main thread, loads on a loader thread and runs steps on the
      // engine's thread. Kernels' OpenMP threads never call MPI.
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        fail("MPI_Init_thread failed (is this process started by mpirun?)");
      }
      if (provided < MPI_THREAD_SERIALIZED) {
        std::fprintf(stderr,
                     "warning: this MPI library gives thread level %d, below MPI_THREAD_SERIALIZED; a "
                     "server calls MPI from more than one thread (one at a time)\n",
                     provided);
      }
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }

  ~MpiCommunicator() override { stop_watchdog(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; keep the compiler and a broken MPI honest
  }

  void finalize() override {
    stop_watchdog();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  void set_watchdog_seconds(double seconds) override {
    stop_watchdog();
    if (seconds <= 0) return;
    limit_ns_ = static_cast<int64_t>(seconds * 1e9);
    running_ = true;
    watchdog_ = std::thread([this] { watch(); });
  }

 protected:
  void do_all_reduce_sum(float* data, int64_t n) override {
    Busy b(*this, Collective::kAllReduce);
    // Large vectors go in pieces so the count fits MPI's int.
    const int64_t piece = INT_MAX / 2;
    for (int64_t off = 0; off < n; off += piece) {
      const int count = static_cast<int>(std::min(piece, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
  }

  void do_all_gather(const void* send, int64_t bytes, void* recv) override {
    Busy b(*this, Collective::kAllGather);
    const int n = to_int(bytes, "all_gather");
    check(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }

  void do_gather(const void* send, int64_t bytes, void* recv, int root) override {
    Busy b(*this, Collective::kGather);
    const int n = to_int(bytes, "gather");
    check(MPI_Gather(send, n, MPI_BYTE, rank_ == root ? recv : nullptr, n, MPI_BYTE, root, MPI_COMM_WORLD),
          "MPI_Gather");
  }

  void do_broadcast(void* data, int64_t bytes, int root) override {
    Busy b(*this, Collective::kBroadcast);
    check(MPI_Bcast(data, to_int(bytes, "broadcast"), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  }

  void do_all_to_all(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) override {
    Busy b(*this, Collective::kAllToAll);
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    int64_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = to_int(send_bytes[r], "all_to_all");
      rc[r] = to_int(recv_bytes[r], "all_to_all");
      sd[r] = to_int(so, "all_to_all");
      rd[r] = to_int(ro, "all_to_all");
      so += send_bytes[r];
      ro += recv_bytes[r];
    }
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD),
          "MPI_Alltoallv");
  }

  void do_barrier() override {
    Busy b(*this, Collective::kBarrier);
    check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
  }

 private:
  // Marks this rank as waiting in a collective, for the watchdog.
  struct Busy {
    Busy(MpiCommunicator& c, Collective kind) : c_(c) {
      if (c_.idle()) return;
      c_.busy_kind_.store(static_cast<int>(kind), std::memory_order_relaxed);
      c_.busy_since_ns_.store(now_ns(), std::memory_order_release);
    }
    ~Busy() { c_.busy_since_ns_.store(0, std::memory_order_release); }
    MpiCommunicator& c_;
  };

  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    fail("rank {}: {} failed: {}", rank_, call, std::string(text, static_cast<size_t>(len)));
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mu_);
    while (running_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      const int64_t since = busy_since_ns_.load(std::memory_order_acquire);
      if (since == 0 || now_ns() - since < limit_ns_) continue;
      const auto kind = static_cast<Collective>(busy_kind_.load(std::memory_order_relaxed));
      std::fprintf(stderr,
                   "error: rank %d of %d: %s has waited %.0f s for the other ranks; a peer rank hung or its host "
                   "is unreachable. Ending the group (raise --tp-timeout if steps are legitimately this slow).\n",
                   rank_, size_, std::string(collective_name(kind)).c_str(), (now_ns() - since) / 1e9);
      std::fflush(stderr);
      // Not MPI_Abort: this thread may not call MPI while the main thread is inside it.
      // mpirun ends the other ranks when this one exits without MPI_Finalize.
      ::_exit(1);
    }
  }

  void stop_watchdog() {
    if (!watchdog_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
    }
    cv_.notify_all();
    watchdog_.join();
  }

  int rank_ = 0;
  int size_ = 1;
  std::atomic<int64_t> busy_since_ns_{0};
  std::atomic<int> busy_kind_{0};
  int64_t limit_ns_ = 0;
  bool running_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread watchdog_;
};

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace infera::parallel

#else  // built without MPI

namespace infera::parallel {

bool mpi_available() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator() {
  fail(
      "this infera was built without MPI, so --tp/--ep above 1 are unavailable: install OpenMPI "
      "(apt-get install openmpi-bin libopenmpi-dev) and rebuild");
}

}  // namespace infera::parallel

#endif
