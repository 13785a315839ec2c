// The seam between the model and the links between ranks: a few collectives over f32
// activations and raw bytes. Two implementations: a single-rank one (every collective is a
// copy or a no-op, so one code path serves TP = 1) and an MPI one (OpenMPI), which works
// the same between processes of one host and between hosts. No home-made networking.
//
// Every collective is timed and counted (CommStats), so a benchmark can report collectives
// per token, bytes moved and the share of step time spent waiting on other ranks.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace infera::parallel {

enum class Collective : uint8_t { kAllReduce, kAllGather, kGather, kBroadcast, kAllToAll, kBarrier, kCount };
std::string_view collective_name(Collective c);  // "all_reduce", ...

struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload this rank contributed (see Communicator for the definition per kind)
  double seconds = 0.0;  // wall time inside the collective on this rank (waiting included)
};

struct CommStats {
  std::array<CollectiveStats, static_cast<size_t>(Collective::kCount)> by_kind{};
  const CollectiveStats& operator[](Collective c) const { return by_kind[static_cast<size_t>(c)]; }
  int64_t calls() const;
  int64_t bytes() const;
  double seconds() const;
};

// All collectives are blocking and must be called by every rank in the same order with
// matching sizes (the usual MPI contract). Bytes counted per call: all_reduce n * 4,
// all_gather / gather the bytes one rank sends, broadcast the message size, all_to_all the
// bytes this rank sends to others. Failures throw infera::Error naming the rank.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "single" | "mpi"

  // data[n] := Σ over ranks of data[n], elementwise, on every rank.
  void all_reduce_sum(float* data, int64_t n);
  // Every rank sends `bytes`; recv [size() * bytes] gets them in rank order, on every rank.
  void all_gather(const void* send, int64_t bytes, void* recv);
  // As all_gather, but only `root` receives (recv is ignored elsewhere and may be null).
  void gather(const void* send, int64_t bytes, void* recv, int root);
  // root's data[bytes] is copied to every rank's data.
  void broadcast(void* data, int64_t bytes, int root);
  // Personalised exchange (expert dispatch): send holds size() blocks packed in rank order,
  // send_bytes[r] for rank r; recv gets recv_bytes[r] from each rank r, packed likewise.
  void all_to_all(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes);
  void barrier();

  // Ends every rank of the group now (MPI_Abort), exit status `code`. For errors one rank
  // sees that the others cannot know about: without it they would wait forever.
  [[noreturn]] virtual void abort(int code) = 0;
  // Orderly shutdown of the group (MPI_Finalize); collectives may not follow.
  virtual void finalize() {}

  // Collectives that wait longer than this are taken as a hung peer: the rank prints a
  // message naming itself and the collective and aborts the group. 0 = never. Waits
  // inside an IdleWait (a worker waiting for the next request) are exempt.
  virtual void set_watchdog_seconds(double seconds) { (void)seconds; }
  class IdleWait {
   public:
    explicit IdleWait(Communicator& c) : c_(c) { c_.idle_ = true; }
    ~IdleWait() { c_.idle_ = false; }
    IdleWait(const IdleWait&) = delete;
    IdleWait& operator=(const IdleWait&) = delete;

   private:
    Communicator& c_;
  };

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  virtual void do_all_reduce_sum(float* data, int64_t n) = 0;
  virtual void do_all_gather(const void* send, int64_t bytes, void* recv) = 0;
  virtual void do_gather(const void* send, int64_t bytes, void* recv, int root) = 0;
  virtual void do_broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void do_all_to_all(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) = 0;
  virtual void do_barrier() = 0;
  bool idle() const { return idle_; }

 private:
  CommStats stats_;
  bool idle_ = false;
};

// One rank: collectives copy or do nothing.
std::unique_ptr<Communicator> make_single_communicator();

// True when this binary was built with MPI.
bool mpi_available();
// True when this process was started by mpirun / an MPI launcher (OMPI_COMM_WORLD_SIZE,
// PMIX_RANK or PMI_RANK in the environment).
bool launched_by_mpi();
// World size / rank announced by the launcher (1 / 0 when not launched by MPI); readable
// before MPI is initialised.
int launcher_world_size();
int launcher_rank();
// Ranks the launcher started on this host (OMPI_COMM_WORLD_LOCAL_SIZE; 1 when unknown):
// they share its cores.
int launcher_local_size();

// MPI_COMM_WORLD of this process (initialises MPI on the first call, with MPI errors
// returned as infera::Error instead of aborting). Throws when built without MPI.
std::unique_ptr<Communicator> make_mpi_communicator();

}  // namespace infera::parallel
