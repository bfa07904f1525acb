// SVG plot writers; see svg_plot.h. One coordinate mapper per axis (linear or log10), "nice" ticks,
// a fixed palette; text is escaped.
#include "sweeps/svg_plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace slidedp {
namespace {

constexpr double kW = 760, kH = 480, kLeft = 80, kRight = 200, kTop = 50, kBottom = 70;
const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

struct Mapper {
  double lo, hi, p0, p1;
  bool log;
  double operator()(double v) const {
    double a = log ? std::log10(v) : v, l = log ? std::log10(lo) : lo, h = log ? std::log10(hi) : hi;
    return p0 + (a - l) / (h - l) * (p1 - p0);
  }
};

std::vector<double> ticks(double lo, double hi, bool log) {
  std::vector<double> t;
  if (log) {
    for (double d = std::pow(10.0, std::floor(std::log10(lo))); d <= hi * 1.0001; d *= 10)
      for (double m : {1.0, 2.0, 5.0})
        if (d * m >= lo * 0.9999 && d * m <= hi * 1.0001) t.push_back(d * m);
    return t;
  }
  const double span = hi - lo, raw = span / 6;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0 : v);
  return t;
}

std::string fmt_tick(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (a >= 1e3) return fmt::format("{:g}k", v / 1e3);
  return fmt::format("{:g}", v);
}

void range(const std::vector<PlotSeries>& series, bool xaxis, bool log, double& lo, double& hi) {
  lo = std::numeric_limits<double>::infinity();
  hi = -lo;
  for (const auto& s : series)
    for (double v : xaxis ? s.x : s.y) {
      if (log && v <= 0) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!std::isfinite(lo)) lo = log ? 1 : 0, hi = log ? 10 : 1;
  if (hi <= lo) hi = lo * 1.1 + (log ? 0 : 1);
  if (log) {
    lo /= 1.2, hi *= 1.2;
  } else {
    double pad = (hi - lo) * 0.05;
    lo = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
    hi += pad;
  }
}

std::string header(const std::string& title, const std::string& caption) {
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kW, kH, kW, kH);
  s += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", kLeft, esc(title));
  if (!caption.empty())
    s += fmt::format("<text x=\"10\" y=\"{}\" font-size=\"9\" fill=\"#666\">{}</text>\n", kH - 8, esc(caption));
  return s;
}

std::string axes(const Mapper& mx, const Mapper& my, const PlotAxis& ax, const PlotAxis& ay) {
  std::string s;
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft, kTop,
                   kW - kLeft - kRight, kH - kTop - kBottom);
  for (double t : ticks(mx.lo, mx.hi, mx.log)) {
    double x = mx(t);
    s += fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#eee\"/>", x, kTop, kH - kBottom);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x, kH - kBottom + 16, fmt_tick(t));
  }
  for (double t : ticks(my.lo, my.hi, my.log)) {
    double y = my(t);
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#eee\"/>", kLeft, kW - kRight, y);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, y + 4, fmt_tick(t));
  }
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (kLeft + kW - kRight) / 2,
                   kH - kBottom + 38, esc(ax.label + (ax.log ? " (log)" : "")));
  s += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", 22,
                   (kTop + kH - kBottom) / 2, esc(ay.label + (ay.log ? " (log)" : "")));
  return s;
}

std::string legend(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    double y = kTop + 10 + 18 * static_cast<double>(i);
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>", kW - kRight + 14, y - 10,
                     kPalette[i % 10]);
    s += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", kW - kRight + 32, y, esc(names[i]));
  }
  return s;
}

}  // namespace

std::string svg_scatter(const ScatterPlot& p) {
  double xl, xh, yl, yh;
  range(p.series, true, p.x.log, xl, xh);
  range(p.series, false, p.y.log, yl, yh);
  if (p.identity_line) {  // same range on both axes so y = x is the diagonal
    xl = yl = std::min(xl, yl);
    xh = yh = std::max(xh, yh);
  }
  Mapper mx{xl, xh, kLeft, kW - kRight, p.x.log}, my{yl, yh, kH - kBottom, kTop, p.y.log};
  std::string s = header(p.title, p.caption) + axes(mx, my, p.x, p.y);
  if (p.identity_line) {
    if (p.band > 0) {
      std::string pts;
      const int n = 40;
      for (int i = 0; i <= n; ++i) {
        double v = p.x.log ? xl * std::pow(xh / xl, i / double(n)) : xl + (xh - xl) * i / n;
        pts += fmt::format("{},{} ", mx(v), my(std::clamp(v * (1 + p.band), yl, yh)));
      }
      for (int i = n; i >= 0; --i) {
        double v = p.x.log ? xl * std::pow(xh / xl, i / double(n)) : xl + (xh - xl) * i / n;
        pts += fmt::format("{},{} ", mx(v), my(std::clamp(v * (1 - p.band), yl, yh)));
      }
      s += fmt::format("<polygon points=\"{}\" fill=\"#dff2df\" stroke=\"none\"/>\n", pts);  // solid: not every renderer has opacity
    }
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#2ca02c\" stroke-dasharray=\"5,3\"/>\n", mx(xl),
                     my(xl), mx(xh), my(xh));
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < p.series.size(); ++i) {
    const auto& se = p.series[i];
    names.push_back(se.name);
    for (size_t k = 0; k < se.x.size(); ++k) {
      // The tooltip goes in a group around the point, not inside <circle>: simple SVG renderers (e.g.
      // ImageMagick's, which turns these files into PNGs) drop a circle that has children.
      const std::string circle = fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\" fill-opacity=\"0.8\"/>",
                                             mx(se.x[k]), my(se.y[k]), kPalette[i % 10]);
      s += k < se.labels.size() ? "<g><title>" + esc(se.labels[k]) + "</title>" + circle + "</g>\n" : circle + "\n";
    }
  }
  if (p.identity_line) names.push_back(p.band > 0 ? fmt::format("y = x, +/-{:.0f}%", p.band * 100) : "y = x");
  s += legend(names);
  return s + "</svg>\n";
}

std::string svg_lines(const LinePlot& p) {
  double xl, xh, yl, yh;
  range(p.series, true, p.x.log, xl, xh);
  range(p.series, false, p.y.log, yl, yh);
  Mapper mx{xl, xh, kLeft, kW - kRight, p.x.log}, my{yl, yh, kH - kBottom, kTop, p.y.log};
  std::string s = header(p.title, p.caption) + axes(mx, my, p.x, p.y);
  std::vector<std::string> names;
  for (size_t i = 0; i < p.series.size(); ++i) {
    const auto& se = p.series[i];
    names.push_back(se.name);
    std::vector<std::pair<double, double>> pts;
    for (size_t k = 0; k < se.x.size(); ++k)
      if (std::isfinite(se.y[k]) && (!p.y.log || se.y[k] > 0)) pts.push_back({se.x[k], se.y[k]});
    std::sort(pts.begin(), pts.end());
    std::string poly;
    for (auto [x, y] : pts) poly += fmt::format("{},{} ", mx(x), my(y));
    s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", poly, kPalette[i % 10]);
    for (auto [x, y] : pts)
      s += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3\" fill=\"{}\"/>", mx(x), my(y), kPalette[i % 10]);
    s += "\n";
  }
  s += legend(names);
  return s + "</svg>\n";
}

std::string svg_bars(const BarPlot& p) {
  double hi = p.reference_line;
  for (const auto& b : p.values)
    for (double v : b)
      if (std::isfinite(v)) hi = std::max(hi, v);
  hi = hi <= 0 ? 1 : hi * 1.1;
  Mapper my{0, hi, kH - kBottom, kTop, false};
  std::string s = header(p.title, p.caption);
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft, kTop,
                   kW - kLeft - kRight, kH - kTop - kBottom);
  for (double t : ticks(0, hi, false)) {
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#eee\"/>", kLeft, kW - kRight, my(t));
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 6, my(t) + 4, fmt_tick(t));
  }
  const double gw = (kW - kLeft - kRight) / std::max<double>(1, static_cast<double>(p.groups.size()));
  const double bw = gw * 0.8 / std::max<double>(1, static_cast<double>(p.bars.size()));
  for (size_t g = 0; g < p.groups.size(); ++g) {
    const double gx = kLeft + gw * static_cast<double>(g) + gw * 0.1;
    for (size_t b = 0; b < p.bars.size(); ++b) {
      const double v = g < p.values[b].size() ? p.values[b][g] : 0;
      if (!std::isfinite(v)) continue;
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {:.3g}</title></rect>\n",
                       gx + bw * static_cast<double>(b), my(v), bw * 0.95, my(0) - my(v), kPalette[b % 10],
                       esc(p.bars[b] + " / " + p.groups[g]), v);
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n", gx + gw * 0.4,
                     kH - kBottom + 16, esc(p.groups[g]));
  }
  if (p.reference_line > 0)
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"#333\" stroke-dasharray=\"4,3\"/>\n", kLeft,
                     kW - kRight, my(p.reference_line));
  s += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", 22,
                   (kTop + kH - kBottom) / 2, esc(p.y_label));
  s += legend(p.bars);
  return s + "</svg>\n";
}

std::string svg_grid(const GridPlot& p) {
  std::map<std::string, int> color;
  for (const auto& row : p.cells)
    for (const auto& c : row)
      if (!c.empty() && !color.count(c)) color[c] = static_cast<int>(color.size());
  std::string s = header(p.title, p.caption);
  const double cw = (kW - kLeft - kRight) / std::max<double>(1, static_cast<double>(p.columns.size()));
  const double ch = (kH - kTop - kBottom) / std::max<double>(1, static_cast<double>(p.rows.size()));
  for (size_t r = 0; r < p.rows.size(); ++r) {
    for (size_t c = 0; c < p.columns.size(); ++c) {
      const std::string& cat = c < p.cells[r].size() ? p.cells[r][c] : "";
      const double x = kLeft + cw * static_cast<double>(c), y = kTop + ch * static_cast<double>(r);
      s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"white\"><title>{}</title></rect>\n", x, y,
                       cw, ch, cat.empty() ? "#f4f4f4" : kPalette[color[cat] % 10], esc(p.rows[r] + " / " + p.columns[c] + ": " + cat));
    }
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"10\">{}</text>\n", kLeft - 6,
                     kTop + ch * (static_cast<double>(r) + 0.5) + 4, esc(p.rows[r]));
  }
  for (size_t c = 0; c < p.columns.size(); ++c)
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n",
                     kLeft + cw * (static_cast<double>(c) + 0.5), kH - kBottom + 16, esc(p.columns[c]));
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (kLeft + kW - kRight) / 2, kH - kBottom + 38,
                   esc(p.x_label));
  s += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n", 14,
                   (kTop + kH - kBottom) / 2, esc(p.y_label));
  std::vector<std::string> names(color.size());
  for (const auto& [k, v] : color) names[static_cast<size_t>(v)] = k;
  s += legend(names);
  return s + "</svg>\n";
}

}  // namespace slidedp
