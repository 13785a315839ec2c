// Line charts as SVG text, for `infera bench` results: panels side by side, each with
// axes, grid, ticks, a legend and one line (with markers) per series. Any browser shows
// the file; the text stays searchable and diffable.
#pragma once

#include <string>
#include <vector>

namespace infera::tools {

struct ChartSeries {
  std::string name;
  std::string color;  // any SVG color, e.g. "#1f77b4"
  std::vector<double> y;  // one per x value of the panel; NaN = no point (the line breaks)
  bool dashed = false;
};

struct ChartPanel {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<double> x;  // shared by all series (plotted on a log2 axis when log_x)
  bool log_x = false;
  std::vector<ChartSeries> series;
};

// The SVG document of the panels side by side, each panel_width x height pixels.
std::string render_svg_chart(const std::vector<ChartPanel>& panels, int panel_width = 520, int height = 400);

// Writes render_svg_chart(panels) to `path`. Throws infera::Error when it cannot.
void write_svg_chart(const std::string& path, const std::vector<ChartPanel>& panels);

}  // namespace infera::tools
