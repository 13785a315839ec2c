// kv_dtype in the deployment YAML (per model): the KV cache storage of that model's engine.
#include <gtest/gtest.h>

#include <string>

#include "infera/base/error.h"
#include "infera/server/deploy_config.h"

using namespace infera;
using namespace infera::server;

TEST(DeployKvDtype, DefaultsToF32AndReadsEachChoice) {
  const DeployConfig plain = parse_deploy_config("models:\n  - name: a\n    path: /m\n", "x.yaml");
  EXPECT_EQ(plain.models.at(0).kv_dtype, DType::kF32);
  const DeployConfig c = parse_deploy_config(
      "models:\n  - name: a\n    path: /m\n    kv_dtype: int8\n  - name: b\n    path: /m\n    kv_dtype: bf16\n",
      "x.yaml");
  EXPECT_EQ(c.models.at(0).kv_dtype, DType::kI8);
  EXPECT_EQ(c.models.at(1).kv_dtype, DType::kBF16);
}

TEST(DeployKvDtype, UnknownDtypeNamesTheFieldAndTheChoices) {
  try {
    parse_deploy_config("models:\n  - name: a\n    path: /m\n    kv_dtype: fp8\n", "x.yaml");
    FAIL() << "fp8 accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("models[0].kv_dtype"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32, bf16 or int8"), std::string::npos) << msg;
  }
}
