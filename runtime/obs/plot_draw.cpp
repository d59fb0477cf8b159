// `cohort plot`'s output side: one gnuplot script and its data files per picture, written next
// to the PNG so a user can edit and re-draw them (`cd DIR && gnuplot loss.gp`). Scripts name
// only their own files, relative to DIR, and every text from the input goes through gp_quote.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "runtime/core/error.hpp"
#include "runtime/obs/plot.hpp"

namespace cohort::obs {

namespace {

namespace fs = std::filesystem;

std::string num(double v) {
  if (!std::isfinite(v)) return "NaN";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// A string column of a data file: gnuplot reads "..." as one column; a quote or a control
// character inside would end or break it, so they become ' and a space.
std::string data_string(const std::string& text) {
  std::string s = "\"";
  for (const char c : text) s += c == '"' ? '\'' : static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  return s + "\"";
}

// Collects what one picture writes and draws it.
class picture {
 public:
  picture(std::string dir, std::string name, plot_result* out)
      : dir_(std::move(dir)), name_(std::move(name)), out_(out) {}

  void data(const std::string& file, const std::string& text) { write(file, text); }

  // Writes NAME.gp (the common preamble, then BODY), runs it and checks NAME.png.
  void draw(const std::string& what, const std::string& title, int width, int height,
            const std::string& body) {
    std::ostringstream gp;
    gp << "# cohort plot: " << what << ".\n"
       << "# Edit and re-draw from this folder: gnuplot " << name_ << ".gp\n"
       << "set terminal pngcairo noenhanced size " << width << "," << height << " font ',10'\n"
       << "set output " << gp_quote(name_ + ".png") << "\n"
       << "set title " << gp_quote(title) << "\n"
       << "set grid\n"
       << body;
    write(name_ + ".gp", gp.str());
    const std::string warnings = run_gnuplot(dir_, name_ + ".gp");
    if (!warnings.empty()) out_->notes.push_back("gnuplot on " + name_ + ".gp: " + warnings);
    const std::string png = (fs::path(dir_) / (name_ + ".png")).string();
    if (!read_png_size(png))
      throw error("gnuplot ran " + (fs::path(dir_) / (name_ + ".gp")).string() +
                  " but wrote no PNG at " + png + "; run that script by hand to see why");
    out_->files.push_back(png);
  }

 private:
  void write(const std::string& file, const std::string& text) {
    const std::string path = (fs::path(dir_) / file).string();
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.close();
    if (!f) throw error("cannot write " + path + "; check the folder given with --out is writable");
    out_->files.push_back(path);
  }

  std::string dir_, name_;
  plot_result* out_;
};

void make_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw usage_error("--out " + dir + ": cannot create the folder (" +
                      (ec ? ec.message() : std::string("a file of that name exists")) +
                      "); give a writable folder");
}

// Points mark the steps of a short run; past a few hundred they would merge into a thick line.
std::string line_style(std::size_t points) {
  return points <= 200 ? "with linespoints pt 7 ps 0.4" : "with lines";
}

std::string titled(const std::string& what, const std::string& run) {
  return run.empty() ? what : what + " (" + run + ")";
}

void draw_loss(const summary_rows& r, picture& p) {
  std::ostringstream d;
  d << "# step t_s loss\n";
  for (const curve_row& c : r.curve) d << c.step << " " << num(c.t_s) << " " << num(c.loss) << "\n";
  p.data("loss.dat", d.str());
  std::ostringstream body;
  body << "set xlabel 'step'\nset ylabel 'loss'\nset key outside right top vertical\n";
  // Room on the right, so an evaluation at the last step is not cut in half by the border.
  body << "set offsets 0, graph 0.03, 0, 0\n";
  std::string plot = "plot 'loss.dat' using 1:3 " + line_style(r.curve.size()) +
                     " lw 2 lc rgb '#1f77b4' title 'training loss'";
  const bool accuracy = std::any_of(r.evals.begin(), r.evals.end(),
                                    [](const eval_row& e) { return e.accuracy.has_value(); });
  if (!r.evals.empty()) {
    std::ostringstream e;
    e << "# step t_s loss accuracy (NaN: none)\n";
    for (const eval_row& v : r.evals)
      e << v.step << " " << num(v.t_s) << " " << num(v.loss) << " " << num(v.accuracy.value_or(NAN))
        << "\n";
    p.data("loss_eval.dat", e.str());
    plot +=
        ", \\\n     'loss_eval.dat' using 1:3 with points pt 7 ps 1.6 lc rgb '#d62728' "
        "title 'eval loss'";
  }
  if (accuracy) {
    body << "set y2label 'eval accuracy (fraction correct)'\nset y2tics\nset ytics nomirror\n";
    plot +=
        ", \\\n     'loss_eval.dat' using 1:4 axes x1y2 with points pt 5 ps 1.6 lc rgb "
        "'#2ca02c' title 'eval accuracy'";
  }
  p.draw("training loss per step, evaluations as points", titled("Loss", r.title), 1000, 560,
         body.str() + plot + "\n");
}

const char* event_colour(const std::string& kind) {
  static const std::map<std::string, const char*> colours = {
      {"kill", "#d62728"},      {"hang", "#9467bd"},     {"slow", "#ff7f0e"},
      {"partition", "#8c564b"}, {"departed", "#7f7f7f"}, {"joined", "#2ca02c"},
      {"drained", "#17becf"},   {"scale", "#bcbd22"}};
  const auto it = colours.find(kind);
  return it == colours.end() ? "#555555" : it->second;
}

// Where each event's label starts, in graph fractions: events closer than 3% of the time axis
// to an earlier one step their labels down (three levels), so that a kill and the rejoin
// right after it stay readable.
std::vector<double> label_heights(const summary_rows& r) {
  double lo = r.curve.front().t_s, hi = r.curve.back().t_s;
  for (const event_row& e : r.events) lo = std::min(lo, e.t_s), hi = std::max(hi, e.t_s);
  const double near = 0.03 * (hi - lo);
  std::vector<double> heights;
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    int level = 0;
    for (std::size_t j = 0; j < i; ++j)
      if (std::abs(r.events[j].t_s - r.events[i].t_s) <= near) ++level;
    heights.push_back(0.98 - 0.3 * (level % 3));
  }
  return heights;
}

void draw_throughput(const summary_rows& r, picture& p) {
  std::ostringstream d;
  d << "# t_s samples_per_s step step_s replicas\n";
  double top = 0;
  for (const curve_row& c : r.curve) {
    d << num(c.t_s) << " " << num(c.samples_per_s) << " " << c.step << " " << num(c.step_s) << " "
      << c.replicas << "\n";
    top = std::max(top, c.samples_per_s);
  }
  p.data("throughput.dat", d.str());
  // A fixed range leaves room above the curve for the event labels.
  std::ostringstream body;
  body << "set xlabel 'time since the first step (s)'\nset ylabel 'throughput (samples/s)'\n"
       << "set yrange [0:" << num(top > 0 ? top * 1.25 : 1.0)
       << "]\nset key outside right top vertical\n";
  std::vector<std::string> kinds;  // in order of first appearance, one legend entry each
  const std::vector<double> heights = label_heights(r);
  for (std::size_t i = 0; i < r.events.size(); ++i) {
    const event_row& e = r.events[i];
    const std::string colour = gp_quote(event_colour(e.kind));
    body << "set arrow from " << num(e.t_s) << ", graph 0 to " << num(e.t_s)
         << ", graph 1 nohead dt 2 lw 1.5 lc rgb " << colour << "\n"
         << "set label " << gp_quote(e.label) << " at " << num(e.t_s) << ", graph "
         << num(heights[i]) << " rotate by 90 right offset 1,0 textcolor rgb " << colour << "\n";
    if (std::find(kinds.begin(), kinds.end(), e.kind) == kinds.end()) kinds.push_back(e.kind);
  }
  body << "plot 'throughput.dat' using 1:2 " << line_style(r.curve.size())
       << " lw 2 lc rgb '#1f3b73' title 'samples/s'";
  for (const std::string& k : kinds)
    body << ", \\\n     NaN with lines dt 2 lw 1.5 lc rgb " << gp_quote(event_colour(k))
         << " title " << gp_quote(k + " event");
  p.draw("samples/s over time, events as dashed lines", titled("Throughput", r.title), 1000, 560,
         body.str() + "\n");
}

void draw_split(const summary_rows& r, picture& p) {
  std::ostringstream d;
  d << "# worker compute_s comm_wait_s bubble_s idle_s\n";
  for (const split_row& s : r.split)
    d << data_string(s.worker) << " " << num(s.compute_s) << " " << num(s.comm_wait_s) << " "
      << num(s.bubble_s) << " " << num(s.idle_s) << "\n";
  p.data("step_split.dat", d.str());
  std::ostringstream body;
  body << "set style data histograms\nset style histogram rowstacked\n"
       << "set style fill solid 0.85 border -1\nset boxwidth 0.6\n"
       << "set xlabel 'worker'\nset ylabel 'time (s)'\nset yrange [0:*]\n"
       << "set key outside right top\n";
  if (r.split.size() > 8) body << "set xtics rotate by -35\n";
  body << "plot 'step_split.dat' using 2:xtic(1) lc rgb '#4e79a7' title 'compute', \\\n"
       << "     '' using 3 lc rgb '#f28e2b' title 'comm wait', \\\n"
       << "     '' using 4 lc rgb '#bab0ac' title 'bubble', \\\n"
       << "     '' using 5 lc rgb '#e15759' title 'idle'\n";
  const int width = std::max(800, 200 + 90 * static_cast<int>(r.split.size()));
  p.draw("per worker, where the run's time went", titled("Time per worker", r.title), width, 560,
         body.str());
}

}  // namespace

plot_result plot_summary(const summary_rows& rows, const std::string& dir) {
  make_dir(dir);
  plot_result out;
  picture loss(dir, "loss", &out);
  draw_loss(rows, loss);
  picture tp(dir, "throughput", &out);
  draw_throughput(rows, tp);
  if (rows.split.empty()) {
    out.notes.push_back("step_split.png not drawn: the summary lists no \"workers\"");
  } else {
    picture split(dir, "step_split", &out);
    draw_split(rows, split);
  }
  return out;
}

namespace {

struct span_style {
  const char* kind;
  const char* title;
  const char* look;  // fill and colour
};
// Bubbles first, so the compute boxes are drawn over them.
const span_style k_span_styles[] = {
    {"bubble", "bubble (waiting)",
     "fs transparent pattern 4 border lc rgb '#9e9e9e' fc rgb '#9e9e9e'"},
    {"forward", "forward", "fs solid 0.9 border lc rgb '#222222' fc rgb '#4e79a7'"},
    {"backward", "backward", "fs solid 0.9 border lc rgb '#222222' fc rgb '#f28e2b'"},
};

}  // namespace

plot_result plot_schedule(const schedule_rows& rows, const std::string& dir) {
  make_dir(dir);
  plot_result out;
  picture p(dir, "pipeline", &out);
  std::ostringstream d, plots;
  d << "# one block per kind of span; columns: lane start_ms end_ms micro_batch\n";
  int block = 0;
  for (const span_style& st : k_span_styles) {
    bool any = false;
    for (const schedule_span& s : rows.spans) {
      if (s.kind != st.kind) continue;
      if (!any) d << (block > 0 ? "\n\n" : "") << "# " << st.kind << "\n";
      any = true;
      d << s.lane << " " << num(s.start_ms) << " " << num(s.end_ms) << " " << s.mb << "\n";
    }
    if (!any) continue;
    const double h = std::string(st.kind) == "bubble" ? 0.42 : 0.32;
    plots << (block > 0 ? ", \\\n     " : "plot ") << "'pipeline.dat' index " << block
          << " using 2:1:2:3:($1-" << h << "):($1+" << h << ") with boxxyerror " << st.look
          << " title " << gp_quote(st.title);
    if (std::string(st.kind) != "bubble")
      plots << ", \\\n     'pipeline.dat' index " << block
            << " using (($2+$3)/2):1:(strcol(4)) with labels textcolor rgb '#ffffff' notitle";
    ++block;
  }
  p.data("pipeline.dat", d.str());
  std::ostringstream body;
  body << "set xlabel \"time from the step's first span (ms)\"\nset ylabel 'worker (stage)'\n"
       // Stage 0 on top: the range runs downwards (gnuplot 5.4 ignores `reverse` on a fixed range).
       << "set xrange [0:*]\nset autoscale xfixmax\nset yrange [" << num(rows.lanes.size() - 0.4)
       << ":-0.6]\n"
       << "set ytics (";
  for (std::size_t i = 0; i < rows.lanes.size(); ++i)
    body << (i > 0 ? ", " : "") << gp_quote(rows.lanes[i].label) << " " << i;
  body << ")\nset grid noytics\nset key outside right top vertical\n";
  const int height = std::max(360, 200 + 70 * static_cast<int>(rows.lanes.size()));
  p.draw("one step's pipeline schedule; boxes labelled by micro-batch",
         "Pipeline schedule of step " + std::to_string(rows.step), 1100, height,
         body.str() + plots.str() + "\n");
  return out;
}

plot_result plot_file(const std::string& input, const std::string& dir,
                      std::optional<int64_t> step) {
  const nlohmann::json j = read_plot_json(input);
  if (detect_plot_input(j, input) == plot_input::trace)
    return plot_schedule(schedule_rows_of(j, input, step), dir);
  plot_result out = plot_summary(summary_rows_of(j, input), dir);
  if (step)
    out.notes.push_back("--step ignored: it picks a step of a trace, and " + input +
                        " is a summary");
  return out;
}

}  // namespace cohort::obs
