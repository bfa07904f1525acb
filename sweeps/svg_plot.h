// Plots as standalone SVG files written directly (no plotting dependency): scatter with a y = x line
// and a +/- band (predicted vs measured), lines (throughput vs tokens per step per system), grouped
// bars (speedups), and a categorical grid (which resource binds where). Every plot carries a caption
// line (command, git revision) so a file found alone still says where it came from.
#pragma once

#include <string>
#include <vector>

namespace slidedp {

struct PlotAxis {
  std::string label;
  bool log = false;
};

struct PlotSeries {
  std::string name;
  std::vector<double> x, y;
  std::vector<std::string> labels;  // optional, per point (shown as a tooltip)
};

struct ScatterPlot {
  std::string title, caption;
  PlotAxis x, y;
  std::vector<PlotSeries> series;
  bool identity_line = true;  // y = x
  double band = 0.10;         // +/- relative band around y = x (0: none)
};

struct LinePlot {
  std::string title, caption;
  PlotAxis x, y;
  std::vector<PlotSeries> series;
};

struct BarPlot {
  std::string title, caption;
  std::string y_label;
  std::vector<std::string> groups;             // x categories
  std::vector<std::string> bars;               // series within a group
  std::vector<std::vector<double>> values;     // [bar][group]
  double reference_line = 0;                   // e.g. 1.0 for speedups (0: none)
};

struct GridPlot {
  std::string title, caption;
  std::string x_label, y_label;
  std::vector<std::string> columns, rows;
  std::vector<std::vector<std::string>> cells;  // [row][column] category ("" = empty)
};

std::string svg_scatter(const ScatterPlot& plot);
std::string svg_lines(const LinePlot& plot);
std::string svg_bars(const BarPlot& plot);
std::string svg_grid(const GridPlot& plot);

}  // namespace slidedp
