// infera bench's client: see bench.h and docs/operations.md.
//
// Requests stream (SSE) so time-to-first-token and inter-token latency are measured on
// the client. The built-in request set is fixed (deterministic text): short, medium and
// long prompts, multi-turn history, tool calls, code; plus extreme inputs (empty,
// overlong, special characters) that must get clean answers (a 2xx or a 4xx JSON error)
// and are counted separately from the latency figures. Warm-up requests are excluded.
#include "infera/tools/bench.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "infera/base/error.h"
#include "infera/base/json_file.h"
#include "infera/tools/svg_chart.h"

namespace infera::tools {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- the request set

struct BenchRequest {
  std::string kind;  // short, medium, long, multi_turn, tool_call, code, empty, overlong, special_chars, file
  json body;  // chat/completions body without model / stream
  bool extreme = false;
};

// Deterministic filler text of about `words` words.
std::string words_text(int words, uint32_t seed) {
  static const char* vocab[] = {"the",     "model",    "server",  "request", "token",  "cache", "memory",
                                "answer",  "question", "quickly", "system",  "engine", "river", "mountain",
                                "history", "science",  "because", "simple",  "number", "write", "explain",
                                "story",   "window",   "context", "batch",   "light"};
  std::mt19937 rng(seed);
  std::string s;
  for (int i = 0; i < words; ++i) {
    if (i) s += (i % 17 == 0) ? ". " : " ";
    s += vocab[rng() % (sizeof(vocab) / sizeof(vocab[0]))];
  }
  return s + ".";
}

json user(const std::string& text) { return {{"role", "user"}, {"content", text}}; }

std::vector<BenchRequest> builtin_requests(const BenchOptions& o) {
  std::vector<BenchRequest> r;
  const int mt = o.max_tokens;
  // Prompt sizes are in tokens; the filler text is sized with the target's tokens per word.
  auto words = [&](int tokens) { return std::max(4, static_cast<int>(tokens / o.tokens_per_word)); };
  const int medium = std::min(300, o.max_context / 4);
  auto add = [&](const std::string& kind, json messages, json extra = json::object(), bool extreme = false) {
    json body = {{"messages", std::move(messages)}, {"max_tokens", mt}, {"temperature", 0}};
    if (extra.is_object()) body.update(extra);
    r.push_back({kind, std::move(body), extreme});
  };
  // Short: 10-50 tokens.
  add("short", json::array({user("What is the capital of France?")}));
  add("short", json::array({user("Write one sentence about " + words_text(6, 1))}));
  add("short", json::array({user("Summarize: " + words_text(25, 2))}));
  // Medium: a few hundred tokens.
  add("medium", json::array({user("Read this and answer briefly. " + words_text(words(medium * 2 / 3), 3))}));
  add("medium", json::array({user("Explain the following notes: " + words_text(words(medium), 4))}));
  // Long: near --max-context, leaving room for the answer and the template.
  add("long",
      json::array({user("Summarize this document. " + words_text(words(o.max_context * 8 / 10 - mt - 32), 5))}));
  // Multi-turn with history.
  add("multi_turn",
      json::array({{{"role", "system"}, {"content", "You are a concise assistant."}},
                   user("Tell me about rivers."),
                   {{"role", "assistant"},
                    {"content", "Rivers carry water from high ground to the sea. " + words_text(words(medium / 3), 6)}},
                   user("And mountains?"),
                   {{"role", "assistant"}, {"content", words_text(words(medium / 2), 7)}},
                   user("Compare the two in one paragraph.")}));
  // Tool call.
  const json tools = json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"},
          {"description", "Current weather for a city"},
          {"parameters",
           {{"type", "object"},
            {"properties", {{"city", {{"type", "string"}}}, {"unit", {{"type", "string"}, {"enum", {"c", "f"}}}}}},
            {"required", {"city"}}}}}}}});
  add("tool_call", json::array({user("What is the weather in Paris right now?")}), {{"tools", tools}});
  // Code.
  add("code", json::array({user("Write a Python function that returns the n-th Fibonacci number, with a docstring.")}));
  add("code", json::array({user(
                  "Fix this C code:\n```c\nint main() { int x[3]; for (int i = 0; i <= 3; i++) x[i] = i; }\n```")}));
  if (!o.no_extreme) {
    add("empty", json::array(), {}, true);  // no messages at all
    add("empty_content", json::array({user("")}), {}, true);  // an empty user turn
    add("overlong", json::array({user(words_text(words(o.max_context * 2), 8))}), {}, true);
    add("special_chars",
        json::array({user("\xF0\x9F\x98\x80 \xE2\x80\x8B\xE2\x80\xAE <|im_end|> <s></s> {{ x }} {% if %} \\u0000 "
                          "\"quoted\" \t\r\n\xE4\xBD\xA0\xE5\xA5\xBD")}),
        {}, true);
    add("negative_max_tokens", json::array({user("hi")}), {{"max_tokens", -5}}, true);
  }
  return r;
}

std::vector<BenchRequest> file_requests(const std::string& path, const BenchOptions& o) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the requests file", path);
  std::vector<BenchRequest> r;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("{}: line {}: not JSON: {}", path, n, e.what());
    }
    if (!j.is_object())
      fail("{}: line {}: expected an object (a chat/completions body, or {{\"prompt\": ...}})", path, n);
    if (j.contains("prompt") && !j.contains("messages")) {
      j["messages"] = json::array({user(j["prompt"].get<std::string>())});
      j.erase("prompt");
    }
    if (!j.contains("max_tokens")) j["max_tokens"] = o.max_tokens;
    const std::string kind = j.value("kind", std::string("file"));
    const bool extreme = j.value("extreme", false);
    j.erase("kind");
    j.erase("extreme");
    r.push_back({kind, j, extreme});
  }
  if (r.empty()) fail("{}: no requests in the file", path);
  return r;
}

// ---------------------------------------------------------------- one request

struct Outcome {
  std::string kind;
  bool extreme = false;
  bool ok = false;  // 2xx with a finished stream
  bool clean_error = false;  // 4xx with a JSON error body
  int status = 0;
  std::string error;
  double ttft_s = NAN;
  double e2e_s = 0;
  int output_tokens = 0;
  std::vector<double> itl_s;  // gaps between content chunks
};

struct Target {
  std::string scheme_host_port;
  std::string base_path;  // "" or "/prefix"
};

Target parse_url(const std::string& url) {
  const auto p = url.find("://");
  if (p == std::string::npos) fail("--url '{}': expected http://host:port", url);
  const auto slash = url.find('/', p + 3);
  Target t;
  t.scheme_host_port = url.substr(0, slash);
  t.base_path = slash == std::string::npos ? "" : url.substr(slash);
  while (!t.base_path.empty() && t.base_path.back() == '/') t.base_path.pop_back();
  if (t.base_path.size() >= 3 && t.base_path.compare(t.base_path.size() - 3, 3, "/v1") == 0)
    t.base_path.resize(t.base_path.size() - 3);
  return t;
}

httplib::Client make_client(const Target& t, const BenchOptions& o) {
  httplib::Client c(t.scheme_host_port);
  const auto secs = static_cast<time_t>(o.timeout);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(secs, 0);
  c.set_write_timeout(secs, 0);
  if (!o.api_key.empty()) c.set_bearer_token_auth(o.api_key.c_str());
  return c;
}

Outcome send_request(const Target& t, const BenchOptions& o, const BenchRequest& req) {
  Outcome out;
  out.kind = req.kind;
  out.extreme = req.extreme;
  json body = req.body;
  body["model"] = o.model;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};

  httplib::Client cli = make_client(t, o);
  httplib::Request hr;
  hr.method = "POST";
  hr.path = t.base_path + "/v1/chat/completions";
  hr.body = body.dump(-1, ' ', false, json::error_handler_t::replace);
  hr.set_header("Content-Type", "application/json");
  hr.set_header("Accept", "text/event-stream");
  if (!o.api_key.empty()) hr.set_header("Authorization", "Bearer " + o.api_key);

  const auto t0 = Clock::now();
  auto last = t0;
  std::string raw, pending;
  int content_chunks = 0, usage_tokens = -1;
  bool done = false;
  hr.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  // SSE: "data: {json}\n\n" events; content deltas mark tokens arriving.
  hr.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    raw.append(data, len);
    if (out.status != 200) return true;
    pending.append(data, len);
    size_t pos;
    while ((pos = pending.find("\n\n")) != std::string::npos) {
      std::string event = pending.substr(0, pos);
      pending.erase(0, pos + 2);
      for (size_t b = 0; b < event.size();) {
        size_t e = event.find('\n', b);
        if (e == std::string::npos) e = event.size();
        std::string line = event.substr(b, e - b);
        b = e + 1;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.rfind("data:", 0) != 0) continue;
        std::string payload = line.substr(5);
        if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        json ev = json::parse(payload, nullptr, false);
        if (ev.is_discarded()) continue;
        if (ev.contains("usage") && ev["usage"].is_object()) usage_tokens = ev["usage"].value("completion_tokens", -1);
        if (ev.contains("error")) out.error = ev["error"].dump();
        bool has_content = false;
        if (ev.contains("choices") && ev["choices"].is_array()) {
          for (const auto& ch : ev["choices"]) {
            const json d = ch.value("delta", json::object());
            auto nonempty = [&](const char* k) {
              return d.contains(k) && d[k].is_string() && !d[k].get<std::string>().empty();
            };
            has_content = has_content || nonempty("content") || nonempty("reasoning_content") ||
                          (d.contains("tool_calls") && !d["tool_calls"].empty());
          }
        }
        if (has_content) {
          const auto now = Clock::now();
          if (content_chunks == 0)
            out.ttft_s = std::chrono::duration<double>(now - t0).count();
          else
            out.itl_s.push_back(std::chrono::duration<double>(now - last).count());
          last = now;
          ++content_chunks;
        }
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(hr, res, err);
  out.e2e_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!sent) {
    out.error = "connection: " + httplib::to_string(err);
    return out;
  }
  if (out.status == 0) out.status = res.status;
  if (out.status >= 200 && out.status < 300) {
    out.ok = done || content_chunks > 0;
    if (!done && out.error.empty()) out.error = "stream ended without [DONE]";
    if (!out.error.empty() && !done) out.ok = false;
    out.output_tokens = usage_tokens >= 0 ? usage_tokens : content_chunks;
  } else {
    const json j = json::parse(raw, nullptr, false);
    out.clean_error = out.status >= 400 && out.status < 500 && !j.is_discarded() && j.contains("error");
    out.error = fmt::format("HTTP {}: {}", out.status, raw.substr(0, 200));
  }
  return out;
}

// ---------------------------------------------------------------- statistics

double percentile(std::vector<double> v, double p) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double idx = p / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(idx)), hi = static_cast<size_t>(std::ceil(idx));
  return v[lo] + (v[hi] - v[lo]) * (idx - lo);
}

json dist_ms(const std::vector<double>& s) {
  auto ms = [](double x) { return std::isfinite(x) ? json(x * 1000.0) : json(nullptr); };
  double sum = 0;
  int n = 0;
  for (double x : s) {
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  }
  return {{"p50", ms(percentile(s, 50))},
          {"p95", ms(percentile(s, 95))},
          {"p99", ms(percentile(s, 99))},
          {"mean", ms(n ? sum / n : NAN)},
          {"count", n}};
}

// infera_* gauges/counters from a Prometheus text page (sum over label sets).
std::map<std::string, double> scrape_metrics(const Target& t, const BenchOptions& o) {
  std::map<std::string, double> m;
  httplib::Client cli = make_client(t, o);
  cli.set_read_timeout(5, 0);
  auto res = cli.Get((t.base_path + "/metrics").c_str());
  if (!res || res->status != 200) return m;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("infera_", 0) != 0) continue;
    const auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    try {
      m[name] += std::stod(line.substr(sp + 1));
    } catch (...) {
    }
  }
  return m;
}

json level_result(const std::string& label, double x, const std::vector<Outcome>& outs, double wall_s,
                  const std::map<std::string, double>& before, const std::map<std::string, double>& after) {
  std::vector<double> ttft, e2e, tpot, itl;
  int normal = 0, errors = 0, tokens = 0, ex_total = 0, ex_clean = 0, ex_ok = 0, ex_unclean = 0;
  json error_samples = json::array();
  std::map<std::string, int> kinds;
  for (const Outcome& r : outs) {
    if (r.extreme) {
      ++ex_total;
      if (r.ok)
        ++ex_ok;
      else if (r.clean_error)
        ++ex_clean;
      else {
        ++ex_unclean;
        if (error_samples.size() < 5) error_samples.push_back(r.kind + ": " + r.error);
      }
      continue;
    }
    ++normal;
    ++kinds[r.kind];
    if (!r.ok) {
      ++errors;
      if (error_samples.size() < 5) error_samples.push_back(r.kind + ": " + r.error);
      continue;
    }
    tokens += r.output_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (r.output_tokens > 1 && std::isfinite(r.ttft_s)) tpot.push_back((r.e2e_s - r.ttft_s) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  json j = {{"label", label},
            {"x", x},
            {"requests", normal},
            {"errors", errors},
            {"error_rate", normal ? static_cast<double>(errors) / normal : 0.0},
            {"wall_s", wall_s},
            {"output_tokens", tokens},
            {"output_tokens_per_s", wall_s > 0 ? tokens / wall_s : 0.0},
            {"requests_per_s", wall_s > 0 ? (normal - errors) / wall_s : 0.0},
            {"ttft_ms", dist_ms(ttft)},
            {"tpot_ms", dist_ms(tpot)},
            {"itl_ms", dist_ms(itl)},
            {"e2e_ms", dist_ms(e2e)},
            {"extreme", {{"total", ex_total}, {"ok", ex_ok}, {"clean_errors", ex_clean}, {"unclean", ex_unclean}}},
            {"kinds", kinds},
            {"error_samples", error_samples}};
  // Infera targets: KV use and speculative acceptance from /metrics.
  auto get = [&](const std::map<std::string, double>& m, const char* k) {
    auto it = m.find(k);
    return it == m.end() ? NAN : it->second;
  };
  const double used = get(after, "infera_kv_blocks_used"), total = get(after, "infera_kv_blocks_total");
  j["kv_usage"] = std::isfinite(used) && total > 0 ? json(used / total) : json(nullptr);
  const double acc = get(after, "infera_spec_accepted_total") - get(before, "infera_spec_accepted_total");
  const double drafted = get(after, "infera_spec_drafted_total") - get(before, "infera_spec_drafted_total");
  j["acceptance_rate"] = std::isfinite(acc) && drafted > 0 ? json(acc / drafted) : json(nullptr);
  return j;
}

// ---------------------------------------------------------------- running levels

class Progress {
 public:
  Progress(std::string label, int total) : label_(std::move(label)), total_(total) {}
  void tick(bool error) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    errors_ += error ? 1 : 0;
    std::fprintf(stderr, "\r%s: %d/%d requests, %d errors   ", label_.c_str(), done_, total_, errors_);
    std::fflush(stderr);
  }
  void finish() { std::fprintf(stderr, "\n"); }

 private:
  std::mutex mu_;
  std::string label_;
  int total_, done_ = 0, errors_ = 0;
};

// The level's workload: the normal requests cycled to --requests, and (once per level)
// every extreme request.
std::vector<const BenchRequest*> workload(const std::vector<BenchRequest>& set, int n) {
  std::vector<const BenchRequest*> normal, out;
  for (const auto& r : set) (r.extreme ? out : normal).push_back(&r);
  for (int i = 0; !normal.empty() && i < n; ++i) out.push_back(normal[i % normal.size()]);
  return out;
}

json run_concurrency(const Target& t, const BenchOptions& o, const std::vector<BenchRequest>& set, int conc) {
  const auto work = workload(set, o.requests);
  const auto before = scrape_metrics(t, o);
  std::vector<Outcome> outs;
  std::mutex mu;
  std::atomic<size_t> next{0};
  Progress progress(fmt::format("concurrency {}", conc), static_cast<int>(work.size()));
  const auto t0 = Clock::now();
  auto expired = [&] {
    return o.duration > 0 && std::chrono::duration<double>(Clock::now() - t0).count() >= o.duration;
  };
  std::vector<std::thread> workers;
  for (int w = 0; w < conc; ++w) {
    workers.emplace_back([&] {
      for (;;) {
        size_t i = next.fetch_add(1);
        if (o.duration > 0) {
          if (expired()) return;
          i %= work.size();  // --duration: keep cycling the set
        } else if (i >= work.size()) {
          return;
        }
        Outcome r = send_request(t, o, *work[i]);
        progress.tick(!r.ok && !r.clean_error);
        std::lock_guard<std::mutex> lock(mu);
        outs.push_back(std::move(r));
      }
    });
  }
  for (auto& w : workers) w.join();
  progress.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  json j = level_result(fmt::format("c={}", conc), conc, outs, wall, before, scrape_metrics(t, o));
  j["concurrency"] = conc;
  return j;
}

json run_rate(const Target& t, const BenchOptions& o, const std::vector<BenchRequest>& set) {
  const auto work = workload(set, o.requests);
  const auto before = scrape_metrics(t, o);
  std::vector<Outcome> outs;
  std::mutex mu;
  std::mt19937_64 rng(12345);
  std::exponential_distribution<double> gap(o.rate);
  Progress progress(fmt::format("rate {}/s", o.rate), static_cast<int>(work.size()));
  const auto t0 = Clock::now();
  std::vector<std::thread> inflight;
  double at = 0;
  for (size_t i = 0;; ++i) {
    if (o.duration > 0 ? at >= o.duration : i >= work.size()) break;
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
    const BenchRequest* req = work[i % work.size()];
    inflight.emplace_back([&, req] {
      Outcome r = send_request(t, o, *req);
      progress.tick(!r.ok && !r.clean_error);
      std::lock_guard<std::mutex> lock(mu);
      outs.push_back(std::move(r));
    });
    at += gap(rng);
  }
  for (auto& th : inflight) th.join();
  progress.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  json j = level_result(fmt::format("rate={}", o.rate), o.rate, outs, wall, before, scrape_metrics(t, o));
  j["rate"] = o.rate;
  return j;
}

double num(const json& j, const std::vector<const char*>& path) {
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return NAN;
    p = &(*p)[k];
  }
  return p->is_number() ? p->get<double>() : NAN;
}

// ---------------------------------------------------------------- result files

json load_result(const std::string& p) { return read_json_file(p, "cannot read the bench result"); }

}  // namespace

// ---------------------------------------------------------------- charts and compare

std::string bench_chart_path(const std::string& requested) {
  const std::string png = ".png";
  if (requested.size() >= png.size() && requested.compare(requested.size() - png.size(), png.size(), png) == 0) {
    const std::string svg = requested.substr(0, requested.size() - png.size()) + ".svg";
    std::fprintf(stderr, "note: charts are SVG now; writing %s instead of %s\n", svg.c_str(), requested.c_str());
    return svg;
  }
  return requested;
}

void write_bench_chart(const std::vector<json>& results, const std::vector<std::string>& names,
                       const std::string& path) {
  ChartPanel lat{"Latency", "concurrency", "milliseconds", {}, true, {}};
  ChartPanel thr{"Throughput", "concurrency", "output tokens/s", {}, true, {}};
  const bool rate = !results.empty() && results[0].contains("levels") && !results[0]["levels"].empty() &&
                    results[0]["levels"][0].contains("rate");
  if (rate) lat.x_label = thr.x_label = "requests/s offered";
  // The x values of every result, in order; a result without a level there has no point.
  std::vector<double> xs;
  for (const json& r : results) {
    for (const auto& l : r.value("levels", json::array())) xs.push_back(num(l, {"x"}));
  }
  xs.erase(std::remove_if(xs.begin(), xs.end(), [](double x) { return !std::isfinite(x); }), xs.end());
  std::sort(xs.begin(), xs.end());
  xs.erase(std::unique(xs.begin(), xs.end()), xs.end());
  lat.x = thr.x = xs;
  for (size_t i = 0; i < results.size(); ++i) {
    const bool dashed = i > 0;
    const std::string suffix = results.size() > 1 ? " (" + (i < names.size() ? names[i] : std::to_string(i)) + ")" : "";
    ChartSeries ttft{"TTFT p50" + suffix, "#1f77b4", {}, dashed}, ttft95{"TTFT p95" + suffix, "#9ecae1", {}, dashed},
        e2e{"end-to-end p50" + suffix, "#d62728", {}, dashed}, itl{"ITL p50" + suffix, "#2ca02c", {}, dashed};
    ChartSeries tps{"output tokens/s" + suffix, "#ff7f0e", {}, dashed},
        rps{"requests/s x100" + suffix, "#9467bd", {}, dashed};
    const json levels = results[i].value("levels", json::array());
    for (double x : xs) {
      json l = json::object();  // none at this x: every figure NaN
      for (const auto& level : levels) {
        if (num(level, {"x"}) == x) l = level;
      }
      ttft.y.push_back(num(l, {"ttft_ms", "p50"}));
      ttft95.y.push_back(num(l, {"ttft_ms", "p95"}));
      e2e.y.push_back(num(l, {"e2e_ms", "p50"}));
      itl.y.push_back(num(l, {"itl_ms", "p50"}));
      tps.y.push_back(num(l, {"output_tokens_per_s"}));
      rps.y.push_back(num(l, {"requests_per_s"}) * 100);
    }
    for (ChartSeries* s : {&e2e, &ttft95, &ttft, &itl}) lat.series.push_back(std::move(*s));
    for (ChartSeries* s : {&tps, &rps}) thr.series.push_back(std::move(*s));
  }
  write_svg_chart(path, {lat, thr});
}

int compare_bench_results(const json& a, const json& b, double regression_threshold, const std::string& chart,
                          const std::string& name_a, const std::string& name_b) {
  struct Metric {
    const char* name;
    std::vector<const char*> path;
    bool higher_is_better;
  };
  const std::vector<Metric> metrics = {{"TTFT p50 ms", {"ttft_ms", "p50"}, false},
                                       {"TTFT p99 ms", {"ttft_ms", "p99"}, false},
                                       {"TPOT p50 ms", {"tpot_ms", "p50"}, false},
                                       {"ITL p50 ms", {"itl_ms", "p50"}, false},
                                       {"E2E p50 ms", {"e2e_ms", "p50"}, false},
                                       {"E2E p99 ms", {"e2e_ms", "p99"}, false},
                                       {"output tok/s", {"output_tokens_per_s"}, true},
                                       {"requests/s", {"requests_per_s"}, true},
                                       {"error rate", {"error_rate"}, false}};
  int regressions = 0;
  std::printf("%-10s %-14s %12s %12s %9s\n", "level", "metric", "A", "B", "change");
  const json levels_a = a.value("levels", json::array()), levels_b = b.value("levels", json::array());
  for (const auto& la : levels_a) {
    const json* lb = nullptr;
    for (const auto& l : levels_b) {
      if (l.value("label", "") == la.value("label", "")) lb = &l;
    }
    if (!lb) {
      std::printf("%-10s (only in A)\n", la.value("label", "?").c_str());
      continue;
    }
    for (const Metric& m : metrics) {
      const double va = num(la, m.path), vb = num(*lb, m.path);
      if (!std::isfinite(va) || !std::isfinite(vb)) continue;
      const double change = va != 0 ? (vb - va) / std::fabs(va) * 100.0 : (vb == 0 ? 0 : 100.0);
      const bool worse = m.higher_is_better ? change < -regression_threshold : change > regression_threshold;
      const bool err_worse = std::string(m.name) == "error rate" && vb > va;
      const bool flag = (worse && std::string(m.name) != "error rate") || err_worse;
      regressions += flag ? 1 : 0;
      std::printf("%-10s %-14s %12.3f %12.3f %+8.1f%%%s\n", la.value("label", "?").c_str(), m.name, va, vb, change,
                  flag ? "  REGRESSION" : "");
    }
  }
  std::printf("%d regression%s (threshold %.0f%%)\n", regressions, regressions == 1 ? "" : "s", regression_threshold);
  if (!chart.empty()) write_bench_chart({a, b}, {name_a, name_b}, chart);
  return regressions;
}

// ---------------------------------------------------------------- main

int run_bench(BenchOptions o) {
  if (!o.compare.empty()) {
    if (o.compare.size() != 2) fail("--compare takes two result files: --compare A.json B.json");
    const std::string chart = o.chart.empty() ? "" : bench_chart_path(o.chart);
    const int regressions = compare_bench_results(load_result(o.compare[0]), load_result(o.compare[1]),
                                                  o.regression_threshold, chart, o.compare[0], o.compare[1]);
    if (!chart.empty()) std::printf("chart: %s\n", chart.c_str());
    return regressions ? 1 : 0;
  }
  const Target t = parse_url(o.url);
  if (o.model.empty()) {
    httplib::Client cli = make_client(t, o);
    auto res = cli.Get((t.base_path + "/v1/models").c_str());
    if (!res) fail("{}: cannot connect ({}); is the server running?", o.url, httplib::to_string(res.error()));
    const json j = json::parse(res->body, nullptr, false);
    if (res->status != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty()) {
      fail("{}/v1/models did not list a model (HTTP {}); pass --model", o.url, res->status);
    }
    o.model = j["data"][0].value("id", "");
  }
  {
    // Tokens per word of the filler text, from the target's tokenizer when it has one.
    httplib::Client cli = make_client(t, o);
    cli.set_read_timeout(10, 0);
    const json req = {{"model", o.model}, {"prompt", words_text(200, 99)}};
    auto res = cli.Post((t.base_path + "/tokenize").c_str(), req.dump(), "application/json");
    const json j = res && res->status == 200 ? json::parse(res->body, nullptr, false) : json();
    if (j.is_object() && j.contains("count") && j["count"].is_number() && j["count"].get<double>() > 0) {
      o.tokens_per_word = j["count"].get<double>() / 201.0;
    }
  }
  const std::vector<BenchRequest> set =
      o.requests_file.empty() ? builtin_requests(o) : file_requests(o.requests_file, o);

  // Warm-up (excluded): the first normal requests, one at a time.
  for (int i = 0, done = 0; done < o.warmup && i < static_cast<int>(set.size()); ++i) {
    if (set[i].extreme) continue;
    send_request(t, o, set[i]);
    ++done;
  }

  json result = {{"target", o.url},
                 {"tokens_per_word", o.tokens_per_word},
                 {"model", o.model},
                 {"request_set", o.requests_file.empty() ? "builtin" : o.requests_file},
                 {"config",
                  {{"requests", o.requests},
                   {"duration_s", o.duration},
                   {"warmup", o.warmup},
                   {"max_tokens", o.max_tokens},
                   {"max_context", o.max_context},
                   {"extreme", !o.no_extreme}}},
                 {"levels", json::array()}};
  if (o.rate > 0) {
    result["levels"].push_back(run_rate(t, o, set));
  } else {
    std::stringstream ss(o.concurrency);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int c = 0;
      try {
        c = std::stoi(item);
      } catch (...) {
      }
      if (c < 1) fail("--concurrency: '{}' is not a positive number (example: 1,4,16)", item);
      result["levels"].push_back(run_concurrency(t, o, set, c));
    }
  }

  std::printf("%-10s %8s %7s %10s %10s %10s %10s %10s %10s %11s %8s\n", "level", "requests", "errors", "TTFT p50",
              "TTFT p99", "TPOT p50", "ITL p50", "E2E p50", "E2E p99", "out tok/s", "req/s");
  for (const auto& l : result["levels"]) {
    std::printf("%-10s %8d %7d %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %8.1fms %11.1f %8.2f\n",
                l["label"].get<std::string>().c_str(), l["requests"].get<int>(), l["errors"].get<int>(),
                num(l, {"ttft_ms", "p50"}), num(l, {"ttft_ms", "p99"}), num(l, {"tpot_ms", "p50"}),
                num(l, {"itl_ms", "p50"}), num(l, {"e2e_ms", "p50"}), num(l, {"e2e_ms", "p99"}),
                num(l, {"output_tokens_per_s"}), num(l, {"requests_per_s"}));
    const json& ex = l["extreme"];
    if (ex["total"].get<int>() > 0) {
      std::printf("           extreme inputs: %d sent, %d clean errors, %d answered, %d NOT clean\n",
                  ex["total"].get<int>(), ex["clean_errors"].get<int>(), ex["ok"].get<int>(), ex["unclean"].get<int>());
    }
    if (!l["kv_usage"].is_null()) std::printf("           KV use %.1f%%\n", l["kv_usage"].get<double>() * 100);
    if (!l["acceptance_rate"].is_null())
      std::printf("           acceptance %.2f\n", l["acceptance_rate"].get<double>());
  }
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    if (!f) fail("{}: cannot write the result", o.out);
    f << result.dump(2) << "\n";
    std::printf("result: %s\n", o.out.c_str());
  }
  if (!o.chart.empty()) {
    const std::string chart = bench_chart_path(o.chart);
    write_bench_chart({result}, {o.model}, chart);
    std::printf("chart: %s\n", chart.c_str());
  }
  return 0;
}

}  // namespace infera::tools
