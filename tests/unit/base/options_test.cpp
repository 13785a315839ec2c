// The declared options (base/options.h): the table is consistent, the docs carry the
// tables generated from it, environment switches are checked against their values, and no
// source reads an environment variable the table does not declare.
#include "infera/base/options.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "infera/base/error.h"

namespace infera {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Options, NamesFlagsKeysAndVariablesAreUnique) {
  std::set<std::string_view> names, yaml, env;
  std::set<std::string> flags_run, flags_serve;
  for (const OptionSpec& s : option_specs()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    if (!s.yaml.empty()) {
      EXPECT_TRUE(yaml.insert(s.yaml).second) << s.yaml;
    }
    if (!s.env.empty()) {
      EXPECT_TRUE(env.insert(s.env).second) << s.env;
    }
    EXPECT_FALSE(s.help.empty()) << s.name;
    EXPECT_NE(s.help.back(), '.') << s.name << ": help is a phrase without a final period";
    EXPECT_TRUE(s.use != 0) << s.name;
    if (s.used_by(kUseRun) || s.used_by(kUseServe)) {
      EXPECT_FALSE(s.flags.empty()) << s.name;
    }
    if (s.used_by(kUseDeploy)) {
      EXPECT_FALSE(s.yaml.empty()) << s.name;
    }
    if (s.used_by(kUseProcess | kUseLauncher)) {
      EXPECT_FALSE(s.env.empty()) << s.name;
    }
    if (s.used_by(kUseRequest)) {
      EXPECT_FALSE(s.request_default.empty()) << s.name;
    }
    if (s.type == OptionType::kChoice) {
      EXPECT_FALSE(s.choices.empty()) << s.name;
    }
    std::stringstream list{std::string(s.flags)};
    for (std::string f; std::getline(list, f, ',');) {
      if (s.used_by(kUseRun)) {
        EXPECT_TRUE(flags_run.insert(f).second) << f;
      }
      if (s.used_by(kUseServe)) {
        EXPECT_TRUE(flags_serve.insert(f).second) << f;
      }
    }
  }
}

TEST(Options, DeclaredDefaultsPassTheirOwnChecks) {
  for (const OptionSpec& s : option_specs()) {
    for (std::string_view d : {s.default_for_run(), s.default_for_serve()}) {
      if (d.empty() || s.type == OptionType::kFlag) continue;
      EXPECT_EQ(check_option_value(s, d), "") << s.name << " default " << d;
    }
  }
}

TEST(Options, ValuesAreCheckedAsDeclared) {
  const OptionSpec& kv = option_spec("kv_dtype");
  EXPECT_EQ(check_option_value(kv, "bf16"), "");
  EXPECT_EQ(check_option_value(kv, "fp8"), "must be one of: f32, bf16, int8");
  const OptionSpec& draft = option_spec("draft_tokens");
  EXPECT_EQ(check_option_value(draft, "16"), "");
  EXPECT_EQ(check_option_value(draft, "17"), "must be [0, 16]");
  EXPECT_EQ(check_option_value(draft, "1.5"), "must be an integer");
  const OptionSpec& rp = option_spec("repetition_penalty");
  EXPECT_EQ(check_option_value(rp, "0"), "must be > 0");
  EXPECT_EQ(check_option_value(rp, "0.5"), "");
  EXPECT_EQ(check_option_value(option_spec("top_p"), "1.01"), "must be [0, 1]");
  EXPECT_EQ(check_option_value(option_spec("tp"), "0"), "must be >= 1");
}

TEST(Options, EnvironmentSwitchesAreCheckedAgainstTheirValues) {
  ::setenv("INFERA_MOE_SCHEDULE", "per_expert", 1);
  EXPECT_EQ(option_env("moe_schedule"), "per_expert");
  ::setenv("INFERA_MOE_SCHEDULE", "fastest", 1);
  try {
    option_env("moe_schedule");
    ADD_FAILURE() << "a bad value must throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("INFERA_MOE_SCHEDULE='fastest'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("auto, per_expert, work_items"), std::string::npos) << msg;
  }
  ::setenv("INFERA_GDN_KERNELS", "fast", 1);
  EXPECT_EQ(option_env("gdn_kernels", BadEnvValue::kWarnAndIgnore), "");  // logged, read as unset
  ::unsetenv("INFERA_GDN_KERNELS");
  ::setenv("INFERA_MOE_SCHEDULE", "", 1);
  EXPECT_EQ(option_env("moe_schedule"), "");
  ::unsetenv("INFERA_MOE_SCHEDULE");
  EXPECT_EQ(option_env("moe_schedule"), "");
}

TEST(Options, LauncherVariablesAreDeclared) {
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "3", 1);
  EXPECT_EQ(launcher_env("OMPI_COMM_WORLD_LOCAL_SIZE"), "3");
  EXPECT_TRUE(launcher_env_set("OMPI_COMM_WORLD_LOCAL_SIZE"));
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_FALSE(launcher_env_set("OMPI_COMM_WORLD_LOCAL_SIZE"));
  EXPECT_EQ(launcher_env("OMPI_COMM_WORLD_LOCAL_SIZE"), "");
}

// README.md and docs/server.md carry each table between <!-- options:NAME --> and
// <!-- /options -->, exactly as options_markdown() writes it.
TEST(Options, DocsCarryTheGeneratedTables) {
  const fs::path root = INFERA_SOURCE_DIR;
  const std::string docs = read_file(root / "README.md") + read_file(root / "docs/server.md");
  for (const OptionTable& table : option_tables()) {
    const std::string begin = "<!-- options:" + std::string(table.name) + " -->\n";
    const size_t at = docs.find(begin);
    ASSERT_NE(at, std::string::npos) << "no " << begin << "in README.md or docs/server.md";
    const size_t from = at + begin.size();
    const size_t end = docs.find("<!-- /options -->", from);
    ASSERT_NE(end, std::string::npos) << "no end marker after " << begin;
    const std::string expected = options_markdown(table.use);
    EXPECT_EQ(docs.substr(from, end - from), expected)
        << "the '" << table.name << "' option table is out of date; replace it with:\n"
        << expected;
  }
}

// Every environment variable a source reads is declared (and so documented): getenv
// appears only in base/options.cpp, besides PATH (finding mpirun) and the variable a
// deploy.yaml key_env names.
TEST(Options, NoSourceReadsAnUndeclaredVariable) {
  const fs::path src = fs::path(INFERA_SOURCE_DIR) / "src/infera";
  const std::set<std::string> allowed = {"base/options.cpp", "parallel/launch.cpp", "server/deploy_config.cpp"};
  const std::regex getenv_call(R"(getenv\(([^)]*)\))");
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    const std::string ext = entry.path().extension().string();
    if (ext != ".cpp" && ext != ".h") continue;
    const std::string rel = fs::relative(entry.path(), src).string();
    const std::string text = read_file(entry.path());
    for (std::sregex_iterator it(text.begin(), text.end(), getenv_call), end; it != end; ++it) {
      const std::string arg = (*it)[1];
      if (rel == "parallel/launch.cpp") {
        EXPECT_EQ(arg, "\"PATH\"") << rel;
      } else if (rel == "server/deploy_config.cpp") {
        EXPECT_EQ(arg, "env.c_str(") << rel << ": only key_env's variable";
      } else {
        EXPECT_TRUE(allowed.contains(rel))
            << rel << " reads getenv(" << arg << "): declare the variable in base/options.cpp and use option_env";
      }
    }
  }
}

}  // namespace
}  // namespace infera
