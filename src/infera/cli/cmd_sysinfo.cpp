// infera sysinfo: what this machine offers the engine (ISA path, the float-weight matmul
// kernels it runs, threads, and on request the measured memory read bandwidth, the decode
// roofline).
#include <omp.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "infera/base/cpu.h"
#include "infera/base/membw.h"
#include "infera/cli/command.h"
#include "infera/kernels/kernels.h"
#include "infera/kernels/quant.h"

namespace infera::cli {
namespace {

struct Options {
  bool bandwidth = false;
  bool json = false;
};

int run(const Options& o) {
  nlohmann::json j;
  j["cpu_features"] = cpu_features().describe();
  j["kernel_path"] = isa_name(best_isa());
  j["cores"] = omp_get_num_procs();
  // The float-weight matmul kernels that path runs (prefill and decode), per weight dtype.
  nlohmann::json fm = nlohmann::json::object();
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32})
    fm[std::string(dtype_name(d))] = kernels::matmul_path(best_isa(), d);
  j["float_matmul"] = fm;
  j["quant_matmul"] = kernels::quant_matmul_path(best_isa());
  j["gguf_matmul"] = kernels::ggml_matmul_path(best_isa());
  if (o.bandwidth) {
    nlohmann::json bw = nlohmann::json::object();
    for (int t = 1; t <= omp_get_num_procs(); t *= 2) bw[std::to_string(t)] = measure_read_bandwidth_gbs(t);
    if ((omp_get_num_procs() & (omp_get_num_procs() - 1)) != 0) {
      bw[std::to_string(omp_get_num_procs())] = measure_read_bandwidth_gbs(omp_get_num_procs());
    }
    j["read_bandwidth_gbs"] = bw;
  }
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("cpu features: %s\nkernel path:  %s\ncores:        %d\n", j["cpu_features"].get<std::string>().c_str(),
                j["kernel_path"].get<std::string>().c_str(), j["cores"].get<int>());
    for (auto& [d, p] : j["float_matmul"].items())
      std::printf("%s matmul: %s\n", d.c_str(), p.get<std::string>().c_str());
    std::printf("quantized matmul: %s\ngguf matmul: %s\n", j["quant_matmul"].get<std::string>().c_str(),
                j["gguf_matmul"].get<std::string>().c_str());
    if (o.bandwidth) {
      for (auto& [t, v] : j["read_bandwidth_gbs"].items())
        std::printf("read bandwidth, %s thread(s): %.1f GB/s\n", t.c_str(), v.get<double>());
    }
  }
  return 0;
}

void setup(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("sysinfo", "Show the CPU features and kernel path; --bandwidth measures memory bandwidth");
  auto o = std::make_shared<Options>();
  cmd->add_flag("--bandwidth", o->bandwidth, "Measure memory read bandwidth (the decode roofline)");
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace

INFERA_REGISTER_COMMAND(sysinfo, setup);

}  // namespace infera::cli
