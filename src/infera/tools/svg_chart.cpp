#include "infera/tools/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>

#include "infera/base/error.h"

namespace infera::tools {
namespace {

std::string escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double v) {
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a < 1e4 && v == std::floor(v)) return fmt::format("{:.0f}", v);
  if (a >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.0f}K", v / 1e3);
  if (a >= 100) return fmt::format("{:.0f}", v);
  if (a >= 10) return fmt::format("{:.1f}", v);
  if (a >= 1) return fmt::format("{:.2f}", v);
  return fmt::format("{:.3f}", v);
}

// A "nice" step (1, 2, 5 x 10^k) giving about `target` ticks over [0, hi].
double nice_step(double hi, int target) {
  const double raw = hi / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

void text(std::string& svg, double x, double y, const std::string& s, const char* anchor = "start", int size = 12,
          const std::string& extra = "") {
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="{}" font-size="{}"{}>{}</text>)", x, y, anchor, size,
                     extra, escape(s));
  svg += '\n';
}

void line(std::string& svg, double x0, double y0, double x1, double y1, const char* color, double width = 1) {
  svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="{}"/>)", x0, y0,
                     x1, y1, color, width);
  svg += '\n';
}

}  // namespace

std::string render_svg_chart(const std::vector<ChartPanel>& panels, int panel_width, int height) {
  const int width = panel_width * static_cast<int>(std::max<size_t>(panels.size(), 1));
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)",
      width, height);
  svg += '\n';
  svg += R"(<rect width="100%" height="100%" fill="white"/>)";
  svg += '\n';
  const char* axis = "#282828";
  const char* grid = "#e1e1e1";
  const char* label = "#3c3c3c";
  for (size_t p = 0; p < panels.size(); ++p) {
    const ChartPanel& pn = panels[p];
    const double ox = static_cast<double>(p) * panel_width;
    const double left = ox + 70, right = ox + panel_width - 20, top = 40, bottom = height - 60;
    svg += fmt::format("<g class=\"panel\" id=\"panel{}\">\n", p);
    text(svg, ox + panel_width / 2.0, 26, pn.title, "middle", 16, R"( font-weight="bold")");
    // Ranges.
    auto xpos = [&](double x) { return pn.log_x ? std::log2(std::max(x, 1e-9)) : x; };
    double xmin = 1e300, xmax = -1e300, ymax = 0;
    for (double x : pn.x) {
      xmin = std::min(xmin, xpos(x));
      xmax = std::max(xmax, xpos(x));
    }
    for (const auto& s : pn.series) {
      for (double y : s.y) {
        if (std::isfinite(y)) ymax = std::max(ymax, y);
      }
    }
    if (!(xmax > xmin)) {
      xmin = (xmin < 1e300 ? xmin : 0) - 1;
      xmax = xmin + 2;
    }
    if (!(ymax > 0)) ymax = 1;
    const double step = nice_step(ymax * 1.05, 5);
    const double ytop = std::ceil(ymax * 1.05 / step) * step;
    auto px = [&](double x) { return left + (xpos(x) - xmin) / (xmax - xmin) * (right - left); };
    auto py = [&](double y) { return bottom - y / ytop * (bottom - top); };
    // Grid, ticks and numbers.
    for (double v = 0; v <= ytop + step / 2; v += step) {
      const double y = py(v);
      line(svg, left, y, right, y, grid);
      text(svg, left - 6, y + 4, tick_label(v), "end", 11, fmt::format(R"( fill="{}")", label));
    }
    for (double x : pn.x) {
      const double X = px(x);
      line(svg, X, top, X, bottom, grid);
      line(svg, X, bottom, X, bottom + 4, axis);
      text(svg, X, bottom + 18, tick_label(x), "middle", 11, fmt::format(R"( fill="{}")", label));
    }
    line(svg, left, top, left, bottom, axis, 2);
    line(svg, left, bottom, right, bottom, axis, 2);
    text(svg, (left + right) / 2, bottom + 40, pn.x_label, "middle");
    const double ymid = (top + bottom) / 2;
    text(svg, ox + 18, ymid, pn.y_label, "middle", 12,
         fmt::format(R"x( transform="rotate(-90 {:.1f} {:.1f})")x", ox + 18, ymid));
    // Series: lines (broken at missing points) with square markers.
    for (const auto& s : pn.series) {
      const std::string dash = s.dashed ? R"( stroke-dasharray="8 5")" : "";
      std::string points, markers;
      auto flush = [&] {
        if (points.empty()) return;
        svg +=
            fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="3"{} points="{}"/>)", s.color, dash, points);
        svg += '\n';
        points.clear();
      };
      for (size_t i = 0; i < pn.x.size() && i < s.y.size(); ++i) {
        if (!std::isfinite(s.y[i])) {
          flush();
          continue;
        }
        const double X = px(pn.x[i]), Y = py(s.y[i]);
        points += fmt::format("{}{:.1f},{:.1f}", points.empty() ? "" : " ", X, Y);
        markers +=
            fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="7" height="7" fill="{}"/>)", X - 3.5, Y - 3.5, s.color);
        markers += '\n';
      }
      flush();
      svg += markers;
    }
    // Legend, top-left inside the plot.
    double ly = top + 8;
    for (const auto& s : pn.series) {
      svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"{}/>)",
                         left + 10, ly, left + 34, ly, s.color, s.dashed ? R"( stroke-dasharray="8 5")" : "");
      svg += '\n';
      text(svg, left + 40, ly + 4, s.name, "start", 11);
      ly += 15;
    }
    svg += "</g>\n";
  }
  svg += "</svg>\n";
  return svg;
}

void write_svg_chart(const std::string& path, const std::vector<ChartPanel>& panels) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("{}: cannot write the chart", path);
  f << render_svg_chart(panels);
  if (!f) fail("{}: cannot write the chart", path);
}

}  // namespace infera::tools
