// SVG plots: well-formed documents with one mark per data point and escaped text.
#include <gtest/gtest.h>

#include "sweeps/svg_plot.h"

namespace slidedp {
namespace {

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(SvgPlot, ScatterLinesBarsAndGridAreWellFormed) {
  ScatterPlot sc;
  sc.title = "a < b & c";
  sc.x = {"measured", true};
  sc.y = {"predicted", true};
  sc.series = {{"s", {0.1, 0.2, 0.4}, {0.11, 0.19, 0.5}, {"p1", "p2", "p3"}}};
  std::string s = svg_scatter(sc);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_EQ(count(s, "<circle"), 3);
  // Every point is a self-closed circle with its tooltip in a group around it (a circle with children
  // is dropped by simple renderers).
  EXPECT_EQ(count(s, "<g><title>"), 3);
  for (size_t p = s.find("<circle"); p != std::string::npos; p = s.find("<circle", p + 1))
    EXPECT_EQ(s.substr(s.find('>', p) - 1, 2), "/>");
  EXPECT_EQ(s.find("</circle>"), std::string::npos);
  EXPECT_NE(s.find("a &lt; b &amp; c"), std::string::npos);
  EXPECT_NE(s.find("<polygon"), std::string::npos);  // the +/-10% band
  LinePlot lp;
  lp.x = {"tokens", true};
  lp.y = {"tokens/s", false};
  lp.series = {{"x", {1, 10, 100}, {5, 7, 9}, {}}, {"y", {1, 10}, {2, 3}, {}}};
  s = svg_lines(lp);
  EXPECT_EQ(count(s, "<polyline"), 2);
  BarPlot bp;
  bp.groups = {"g1", "g2"};
  bp.bars = {"a", "b", "c"};
  bp.values = {{1, 2}, {3, 4}, {5, 6}};
  bp.reference_line = 1;
  s = svg_bars(bp);
  EXPECT_EQ(count(s, "<title>"), 6);
  GridPlot gp;
  gp.columns = {"c1", "c2"};
  gp.rows = {"r1"};
  gp.cells = {{"host_mem", "gpu_compute"}};
  s = svg_grid(gp);
  EXPECT_EQ(count(s, "<title>"), 2);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace slidedp
