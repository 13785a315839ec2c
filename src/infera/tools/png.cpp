#include "infera/tools/png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <fmt/format.h>

#include "infera/base/error.h"

namespace infera {
namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + start, static_cast<uInt>(out.size() - start));
  put_u32(out, static_cast<uint32_t>(crc));
}

// 5x7 glyphs, one string of 35 '#'/'.' per character (row-major).
const std::map<char, const char*>& font() {
  static const std::map<char, const char*> f = {
      {' ', "..................................."},
      {'0', ".###.#...##..###.#.###..##...#.###."}, {'1', "..#...##....#....#....#....#...###."},
      {'2', ".###.#...#....#...#...#...#...#####"}, {'3', "#####...#...#.....#.....##...#.###."},
      {'4', "...#...##..#.#.#..#.#####...#....#."}, {'5', "######....####.....#....##...#.###."},
      {'6', "..##..#...#....####.#...##...#.###."}, {'7', "#####....#...#...#...#....#....#..."},
      {'8', ".###.#...##...#.###.#...##...#.###."}, {'9', ".###.#...##...#.####....#...#..##.."},
      {'A', ".###.#...##...#######...##...##...#"}, {'B', "####.#...##...#####.#...##...#####."},
      {'C', ".###.#...##....#....#....#...#.###."}, {'D', "###..#..#.#...##...##...##..#.###.."},
      {'E', "######....#....####.#....#....#####"}, {'F', "######....#....####.#....#....#...."},
      {'G', ".###.#...##....#.####...##...#.####"}, {'H', "#...##...##...#######...##...##...#"},
      {'I', ".###...#....#....#....#....#...###."}, {'J', "..###...#....#....#....#.#..#..##.."},
      {'K', "#...##..#.#.#..##...#.#..#..#.#...#"}, {'L', "#....#....#....#....#....#....#####"},
      {'M', "#...###.###.#.##...##...##...##...#"}, {'N', "#...##...###..##.#.##..###...##...#"},
      {'O', ".###.#...##...##...##...##...#.###."}, {'P', "####.#...##...#####.#....#....#...."},
      {'Q', ".###.#...##...##...##.#.##..#..##.#"}, {'R', "####.#...##...#####.#.#..#..#.#...#"},
      {'S', ".####.....#.....###.....#....#####."}, {'T', "#####..#....#....#....#....#....#.."},
      {'U', "#...##...##...##...##...##...#.###."}, {'V', "#...##...##...##...##...#.#.#...#.."},
      {'W', "#...##...##...##.#.##.#.##.#.#.#.#."}, {'X', "#...##...#.#.#...#...#.#.#...##...#"},
      {'Y', "#...##...#.#.#...#....#....#....#.."}, {'Z', "#####....#...#...#...#...#....#####"},
      {'.', "..........................##...##.."}, {',', ".....................##....#...#..."},
      {':', "......##...##........##...##......."}, {'/', "....#....#...#...#...#...#....#...."},
      {'%', "##...##..#...#...#...#...#..##...##"}, {'(', "..#...#...#....#....#.....#.....#.."},
      {')', ".#.....#.....#....#....#...#...#..."}, {'-', "...............#####..............."},
      {'_', "..............................#####"}, {'=', "..........#####.....#####.........."},
      {'+', ".......#....#..#####..#....#......."}, {'@', ".###.#...##.####.#.##.####.....####"},
      {'[', ".###..#....#....#....#....#....###."}, {']', ".###....#....#....#....#....#..###."},
      {'<', "...#...#...#...#.....#.....#.....#."}, {'>', ".#.....#.....#.....#...#...#...#..."},
      {'?', ".###.#...#....#...#...#.........#.."}, {'!', "..#....#....#....#....#.........#.."},
      {'#', ".#.#..#.#.#####.#.#.#####.#.#..#.#."}, {'*', ".......#..#.#.#.###.#.#.#..#......."},
      {'\'', "..#....#...#......................."}, {'"', ".#.#..#.#.........................."},
      {'|', "..#....#....#....#....#....#....#.."}, {'&', ".##..#..#.#.#...#...#.#.##..#..##.#"},
  };
  return f;
}

const char* glyph(char ch) {
  if (ch >= 'a' && ch <= 'z') ch = static_cast<char>(ch - 'a' + 'A');
  auto it = font().find(ch);
  return it == font().end() ? font().at('?') : it->second;
}

bool glyph_pixel(const char* g, int gx, int gy) {
  const size_t i = static_cast<size_t>(gy * 5 + gx);
  size_t n = 0;
  while (g[n]) ++n;
  return i < n && g[i] == '#';
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

}  // namespace

std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * height * 3) {
    fail("PNG: {}x{} image needs {} bytes of RGB, got {}", width, height, static_cast<size_t>(width) * height * 3, rgb.size());
  }
  // Each row is prefixed by its filter type (0 = none).
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(height) * (width * 3 + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), rgb.begin() + static_cast<size_t>(y) * width * 3, rgb.begin() + static_cast<size_t>(y + 1) * width * 3);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> z(zlen);
  if (compress2(z.data(), &zlen, raw.data(), static_cast<uLong>(raw.size()), 9) != Z_OK) fail("PNG: zlib compression failed");
  z.resize(zlen);

  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(width));
  put_u32(ihdr, static_cast<uint32_t>(height));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit, RGB, deflate, adaptive filters, no interlace
  chunk(out, "IHDR", ihdr);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", {});
  return out;
}

void write_png_rgb(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb) {
  const std::vector<uint8_t> png = encode_png_rgb(width, height, rgb);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot write the chart", path);
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) fail("{}: write failed", path);
}

Canvas::Canvas(int width, int height, Rgb bg) : w_(width), h_(height), px_(static_cast<size_t>(width) * height * 3) {
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

Rgb Canvas::at(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void Canvas::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y) {
    for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) set(x, y, c);
  }
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  // Bresenham with a square brush.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  const int r0 = -(thickness - 1) / 2, r1 = thickness / 2;
  for (;;) {
    fill_rect(x0 + r0, y0 + r0, x0 + r1, y0 + r1, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

int Canvas::text_width(const std::string& s, int scale) { return static_cast<int>(s.size()) * 6 * scale; }

int Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  int cx = x;
  for (char ch : s) {
    const char* g = glyph(ch);
    for (int gy = 0; gy < 7; ++gy) {
      for (int gx = 0; gx < 5; ++gx) {
        if (glyph_pixel(g, gx, gy)) fill_rect(cx + gx * scale, y + gy * scale, cx + gx * scale + scale - 1, y + gy * scale + scale - 1, c);
      }
    }
    cx += 6 * scale;
  }
  return cx - x;
}

void Canvas::text_vertical(int x, int y, const std::string& s, Rgb c, int scale) {
  int cy = y;
  for (char ch : s) {
    const char* g = glyph(ch);
    for (int gy = 0; gy < 7; ++gy) {
      for (int gx = 0; gx < 5; ++gx) {
        // Rotated CCW: glyph x goes up, glyph y goes right.
        if (glyph_pixel(g, gx, gy)) fill_rect(x + gy * scale, cy - gx * scale - scale + 1, x + gy * scale + scale - 1, cy - gx * scale, c);
      }
    }
    cy -= 6 * scale;
  }
}

Canvas render_chart(const std::vector<ChartPanel>& panels, int panel_width, int height) {
  Canvas cv(panel_width * static_cast<int>(std::max<size_t>(panels.size(), 1)), height);
  const Rgb axis{40, 40, 40}, grid{225, 225, 225}, label{60, 60, 60};
  for (size_t p = 0; p < panels.size(); ++p) {
    const ChartPanel& pn = panels[p];
    const int ox = static_cast<int>(p) * panel_width;
    const int left = ox + 70, right = ox + panel_width - 20, top = 40, bottom = height - 60;
    cv.text(ox + (panel_width - Canvas::text_width(pn.title, 2)) / 2, 10, pn.title, axis, 2);
    // Ranges.
    auto xpos = [&](double x) { return pn.log_x ? std::log2(std::max(x, 1e-9)) : x; };
    double xmin = 1e300, xmax = -1e300, ymax = 0;
    for (double x : pn.x) {
      xmin = std::min(xmin, xpos(x));
      xmax = std::max(xmax, xpos(x));
    }
    for (const auto& s : pn.series) {
      for (double y : s.y) if (std::isfinite(y)) ymax = std::max(ymax, y);
    }
    if (!(xmax > xmin)) {
      xmin -= 1;
      xmax += 1;
    }
    if (!(ymax > 0)) ymax = 1;
    const double step = nice_step(ymax * 1.05, 5);
    const double ytop = std::ceil(ymax * 1.05 / step) * step;
    auto px = [&](double x) { return left + static_cast<int>(std::lround((xpos(x) - xmin) / (xmax - xmin) * (right - left))); };
    auto py = [&](double y) { return bottom - static_cast<int>(std::lround(y / ytop * (bottom - top))); };
    // Grid, ticks and numbers.
    for (double v = 0; v <= ytop + step / 2; v += step) {
      const int y = py(v);
      cv.line(left, y, right, y, grid);
      const std::string t = tick_label(v);
      cv.text(left - 6 - Canvas::text_width(t), y - 3, t, label);
    }
    for (double x : pn.x) {
      const int X = px(x);
      cv.line(X, top, X, bottom, grid);
      cv.line(X, bottom, X, bottom + 4, axis);
      const std::string t = tick_label(x);
      cv.text(X - Canvas::text_width(t) / 2, bottom + 8, t, label);
    }
    cv.line(left, top, left, bottom, axis, 2);
    cv.line(left, bottom, right, bottom, axis, 2);
    cv.text(left + (right - left - Canvas::text_width(pn.x_label)) / 2, bottom + 24, pn.x_label, axis);
    cv.text_vertical(ox + 8, top + (bottom - top + Canvas::text_width(pn.y_label)) / 2, pn.y_label, axis);
    // Series: lines with square markers.
    for (const auto& s : pn.series) {
      int last_x = -1, last_y = -1;
      for (size_t i = 0; i < pn.x.size() && i < s.y.size(); ++i) {
        if (!std::isfinite(s.y[i])) {
          last_x = -1;
          continue;
        }
        const int X = px(pn.x[i]), Y = py(s.y[i]);
        if (last_x >= 0) cv.line(last_x, last_y, X, Y, s.color, 3);
        cv.fill_rect(X - 3, Y - 3, X + 3, Y + 3, s.color);
        last_x = X;
        last_y = Y;
      }
    }
    // Legend, top-left inside the plot.
    int ly = top + 6;
    for (const auto& s : pn.series) {
      cv.fill_rect(left + 10, ly, left + 24, ly + 6, s.color);
      cv.text(left + 30, ly, s.name, axis);
      ly += 12;
    }
  }
  return cv;
}

}  // namespace infera
