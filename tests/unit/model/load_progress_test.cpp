// Load progress (base/load_progress.h): the steps' shares of the whole, and what each loader
// reports: safetensors mapped and read into memory, a GGUF file, a generated model, and the
// same model in Infera's quantized format and in published pre-quantized formats (FP8,
// compressed-tensors, GPTQ). In every case the fraction only grows and ends at 1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../test_support.h"
#include "infera/base/load_progress.h"
#include "infera/io/safetensors.h"
#include "infera/model/model.h"
#include "infera/model/prequant.h"
#include "infera/quant/quantize_model.h"

namespace infera {
namespace {

namespace fs = std::filesystem;
using Snapshot = LoadProgress::Snapshot;

// Every snapshot the progress publishes, in order.
struct Recorder {
  std::vector<Snapshot> seen;
  std::shared_ptr<LoadProgress> progress =
      std::make_shared<LoadProgress>([this](const Snapshot& s) { seen.push_back(s); });
};

// The fraction never goes back, stays in [0, 1] and ends at exactly 1; each step's work stays
// within its total; the steps are `steps`, in that order; and binding reported work between
// its start and its end (tensor by tensor, not one jump).
void expect_complete(const std::vector<Snapshot>& seen, const std::vector<std::string>& steps) {
  ASSERT_FALSE(seen.empty());
  double last = 0;
  std::vector<std::string> begun;
  bool binding_midway = false;
  for (const Snapshot& s : seen) {
    EXPECT_GE(s.fraction, last) << s.step;
    EXPECT_LE(s.fraction, 1.0);
    EXPECT_LE(s.done, s.total) << s.step;
    EXPECT_LE(s.steps_done, s.steps);
    last = s.fraction;
    if (!s.step.empty() && (begun.empty() || begun.back() != s.step)) begun.push_back(s.step);
    if (s.step == "binding" && s.done > 0 && s.done < s.total) binding_midway = true;
  }
  EXPECT_EQ(seen.back().fraction, 1.0);
  EXPECT_EQ(seen.back().steps_done, seen.back().steps);
  EXPECT_EQ(seen.back().steps, static_cast<int>(steps.size()));
  EXPECT_EQ(begun, steps);
  EXPECT_TRUE(binding_midway) << "binding reported no work before it ended";
}

// The "binding" step's total (bytes the table's rows store); -1 when there was none.
int64_t binding_total(const std::vector<Snapshot>& seen) {
  for (const Snapshot& s : seen) {
    if (s.step == "binding") return s.total;
  }
  return -1;
}

std::vector<Snapshot> expect_load_completes(const std::string& dir, bool into_memory,
                                            const std::vector<std::string>& steps) {
  Recorder r;
  LoadOptions o;
  o.load_into_memory = into_memory;
  o.progress = r.progress;
  std::unique_ptr<Model> model = load_model(dir, o);
  EXPECT_NE(model, nullptr);
  if (!model) return r.seen;
  expect_complete(r.seen, steps);
  if (into_memory) {  // the reading step counted every byte of the files
    for (const Snapshot& s : r.seen) {
      if (s.step == "reading" && s.steps_done == 1) {
        EXPECT_EQ(s.done, s.total);
      }
    }
  }
  return r.seen;
}

TEST(LoadProgress, StepsShareTheWholeAndNeverGoBack) {
  Recorder r;
  LoadProgress& p = *r.progress;
  EXPECT_EQ(p.snapshot().fraction, 0.0);
  p.plan(2);
  p.begin("reading", 100);
  p.advance(50);
  EXPECT_DOUBLE_EQ(p.snapshot().fraction, 0.25);
  p.advance(500);  // past the total: clamped
  EXPECT_EQ(p.snapshot().done, 100);
  EXPECT_DOUBLE_EQ(p.snapshot().fraction, 0.5);
  p.begin("binding", 0);  // ends "reading"; an empty step counts only when it ends
  EXPECT_EQ(p.snapshot().steps_done, 1);
  EXPECT_DOUBLE_EQ(p.snapshot().fraction, 0.5);
  p.plan(2);  // planned late: the fraction waits instead of going back
  EXPECT_DOUBLE_EQ(p.snapshot().fraction, 0.5);
  p.end();
  p.advance(10);  // no step open: nothing changes
  p.end();
  EXPECT_EQ(p.snapshot().steps_done, 2);
  EXPECT_EQ(p.snapshot().step, "binding");
  for (size_t i = 1; i < r.seen.size(); ++i) EXPECT_GE(r.seen[i].fraction, r.seen[i - 1].fraction);
}

TEST(LoadProgress, SafetensorsMappedAndReadIntoMemory) {
  INFERA_REQUIRE_FIXTURE(test::stories_dir());
  expect_load_completes(test::stories_dir(), false, {"binding"});
  expect_load_completes(test::stories_dir(), true, {"reading", "binding"});
}

TEST(LoadProgress, GgufFile) {
  INFERA_REQUIRE_FIXTURE(test::stories_gguf());
  expect_load_completes(test::stories_gguf(), false, {"converting", "binding"});
  expect_load_completes(test::stories_gguf(), true, {"reading", "converting", "binding"});
}

TEST(LoadProgress, GeneratedModelAndItsQuantizedCheckpoint) {
  const fs::path scratch = test::process_scratch_dir("infera_load_progress");
  const std::string dir = test::generate_model(scratch / "hybrid", test::kTinyHybridArgs);
  expect_load_completes(dir, false, {"binding"});
  // Infera's own quantized format: binding reads <name>.qweight and .scales (and repacks).
  const fs::path qdir = scratch / "hybrid_w8a8";
  quant::QuantizeOptions qo;
  quant::quantize_model(dir, qdir.string(), qo);
  expect_load_completes(qdir.string(), false, {"binding"});
  expect_load_completes(qdir.string(), true, {"reading", "binding"});
}

// A published pre-quantized checkpoint binds every tensor it stores (a dense llama: no tensor
// is left unread), so the binding step counts exactly the bytes of its files' tensors: FP8
// bytes and their block scales, packed int4 words and their group scales and zeros, GPTQ's
// qweight / qzeros / scales / g_idx (the default estimate, 2 bytes per element, counts FP8
// twice over and int4 four times). Read into memory, the files are the load's first step.
TEST(LoadProgress, PrequantizedCheckpointsCountTheirStoredBytes) {
  const fs::path scratch = test::process_scratch_dir("infera_load_progress");
  const std::string src =
      test::generate_model(scratch / "llama",
                           "--arch llama --hidden 128 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ffn 320 "
                           "--vocab 300 --seed 3");
  struct Case {
    const char* name;
    std::string cmd;
  };
  const std::string tools = std::string(INFERA_SOURCE_DIR) + "/tools/";
  const std::vector<Case> cases = {
      {"fp8_block", tools + "prequant_write.py " + src + " {} --format fp8-block"},
      {"ct_w4a16_asym", tools + "prequant_write.py " + src + " {} --format ct-w4a16 --asym --group-size 64"},
      {"gptq_act",
       tools + "prequant_write_gptq_awq_slim.py " + src + " {} --format gptq --group-size 32 --desc-act --asym"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = (scratch / c.name).string();
    std::string cmd = c.cmd;
    cmd.replace(cmd.find("{}"), 2, dir);
    ASSERT_EQ(std::system(("/usr/bin/python3 " + cmd + " > /dev/null").c_str()), 0) << cmd;
    ASSERT_NE(detect_prequant(dir), nullptr);
    const WeightStore store = WeightStore::open(dir);
    int64_t file_bytes = 0;
    for (const std::string& name : store.names()) file_bytes += static_cast<int64_t>(store.get(name).nbytes);
    EXPECT_EQ(binding_total(expect_load_completes(dir, false, {"binding"})), file_bytes);
    // Read into memory: the reading step first, then binding over the same bytes.
    EXPECT_EQ(binding_total(expect_load_completes(dir, true, {"reading", "binding"})), file_bytes);
  }
}

}  // namespace
}  // namespace infera
