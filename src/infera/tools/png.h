// Minimal PNG writer (8-bit RGB, zlib-deflated, one IDAT) and a line-chart renderer with a
// built-in 5x7 bitmap font, for `infera bench` result charts. No image library needed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace infera {

// PNG bytes of an RGB image, pixels row-major [height][width][3]. Throws infera::Error.
std::vector<uint8_t> encode_png_rgb(int width, int height, const std::vector<uint8_t>& rgb);
void write_png_rgb(const std::string& path, int width, int height, const std::vector<uint8_t>& rgb);

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

// An RGB canvas with the few primitives a chart needs.
class Canvas {
 public:
  Canvas(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return w_; }
  int height() const { return h_; }
  const std::vector<uint8_t>& pixels() const { return px_; }
  Rgb at(int x, int y) const;

  void set(int x, int y, Rgb c);
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // inclusive corners
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
  // Text with the 5x7 font (lower case drawn as upper case), scale >= 1; returns the width.
  int text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1);
  // Text rotated 90 degrees counter-clockwise (y axis labels), starting at (x, y) going up.
  void text_vertical(int x, int y, const std::string& s, Rgb c, int scale = 1);

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

struct ChartSeries {
  std::string name;
  Rgb color;
  std::vector<double> y;  // one per x value; NaN = no point
};

struct ChartPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<double> x;  // shared by all series (plotted on a log2 axis when log_x)
  bool log_x = false;
  std::vector<ChartSeries> series;
};

// Panels side by side; axes with ticks and numbers, legend per panel.
Canvas render_chart(const std::vector<ChartPanel>& panels, int panel_width = 520, int height = 400);

}  // namespace infera
