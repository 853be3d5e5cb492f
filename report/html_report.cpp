// The HTML report: static HTML + SVG written here, a small inline script adds the interactive parts.
#include "report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apart_version.h"
#include "graph/checked.h"
#include "graph/error.h"
#include "plan/plan_summary.h"
#include "plan/training.h"
#include "report/stage_graph.h"
#include "simulator/sim_report.h"

namespace apart::report {
namespace {

using json = nlohmann::ordered_json;

std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, int decimals = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string percent(double fraction) {
  if (fraction > 0 && fraction < 0.001) return "<0.1%";
  return num(fraction * 100, 1) + "%";
}

// Stage colours: a fixed qualitative palette (Tableau 10), cycled.
const char* stage_colour(int stage) {
  static const char* const palette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
                                        "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return palette[static_cast<size_t>(stage < 0 ? 0 : stage) % 10];
}

// Micro-batch hue: golden-angle steps, so neighbours differ.
int microbatch_hue(int64_t mb) { return static_cast<int>(std::fmod(static_cast<double>(mb) * 137.508, 360.0)); }

std::string devices_text(const std::vector<int>& d) {
  if (d.empty()) return "-";
  if (d.size() == 1) return std::to_string(d.front());
  return std::to_string(d.front()) + "–" + std::to_string(d.back());
}

// A "nice" tick step (1, 2 or 5 × 10^k) giving about `target` ticks over `span`.
double tick_step(double span, int target) {
  if (!(span > 0)) return 1;
  const double raw = span / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (raw <= f * mag) return f * mag;
  return 10 * mag;
}

const char* kStyle = R"CSS(
:root{--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#ffffff;--panel:#f6f8fa;--accent:#0969da}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 28px 10px;border-bottom:1px solid var(--line);background:var(--panel)}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:0 0 10px}
.sub{color:var(--muted);margin:0}
main{padding:8px 28px 28px;max-width:1400px}
section{margin-top:22px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 12px;background:var(--bg)}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.03em}
.card .v{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.card .n{color:var(--muted);font-size:12px}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}
th,td{padding:4px 10px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{background:var(--panel);font-weight:600;cursor:default}
td.l,th.l{text-align:left}
th.sortable{cursor:pointer}
th.sortable:after{content:" \2195";color:var(--muted);font-weight:400}
.swatch{display:inline-block;width:11px;height:11px;border-radius:2px;vertical-align:-1px;margin-right:5px}
.membar{position:relative;width:180px;height:14px;background:#eef1f4;border-radius:3px;overflow:hidden;display:inline-block;vertical-align:middle}
.membar span{position:absolute;left:0;top:0;bottom:0;border-radius:3px}
.memtext{display:inline-block;min-width:120px;text-align:right;margin-left:6px}
.note{color:var(--muted);font-size:12.5px}
svg text{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}
.tl .ev:hover,.tl .ev.hl{stroke:#111;stroke-width:1.2}
.tl.dim .ev:not(.hl){opacity:.35}
.tl.crit-on .ev.crit{stroke:#d1242f;stroke-width:2.2}
.tl.no-xfer .xfer{display:none}
.controls{margin:6px 0 8px;display:flex;gap:18px;align-items:center;flex-wrap:wrap}
.legend{display:flex;gap:14px;flex-wrap:wrap;color:var(--muted);font-size:12.5px}
#tip{position:fixed;pointer-events:none;background:#1f2328;color:#fff;padding:5px 8px;border-radius:5px;font-size:12px;white-space:pre;display:none;z-index:10;max-width:520px}
#errors{background:#ffebe9;border:1px solid #d1242f;color:#82071e;padding:8px 12px;margin:12px 28px;border-radius:6px;white-space:pre-wrap}
#layer-filter{padding:4px 8px;border:1px solid var(--line);border-radius:6px;width:260px}
details summary{cursor:pointer;color:var(--accent)}
.layer-list{max-height:360px;overflow:auto;border:1px solid var(--line);border-radius:6px;margin-top:8px;display:inline-block}
.best{font-weight:600}
.this{background:#ddf4ff}
footer{color:var(--muted);font-size:12px;padding:12px 28px;border-top:1px solid var(--line)}
)CSS";

// The script: error capture first, then the interactive parts; data-rendered="ok" once everything is built.
const char* kScript = R"JS(
(function(){
  function fail(msg){
    var e=document.getElementById('errors');
    if(e){e.hidden=false;e.textContent+=(e.textContent?'\n':'')+'script error: '+msg;}
    document.body.setAttribute('data-rendered','error');
  }
  window.onerror=function(msg,src,line,col){fail(msg+' (line '+line+')');return false;};
  var data=JSON.parse(document.getElementById('apart-data').textContent);
  function fmt4(v,u){var a=Math.abs(v);return v.toFixed(a>=100?1:a>=10?2:3)+' '+u;}
  function fmtS(s){var a=Math.abs(s);if(a===0)return '0 s';if(a<1e-3)return fmt4(s*1e6,'\u00b5s');if(a<1)return fmt4(s*1e3,'ms');if(a<60)return fmt4(s,'s');if(a<3600)return fmt4(s/60,'min');return fmt4(s/3600,'h');}
  function fmtB(b){var u=[' B',' KiB',' MiB',' GiB',' TiB',' PiB'],i=0;while(Math.abs(b)>=1024&&i<u.length-1){b/=1024;i++;}return (i||Math.floor(b)!==b?b.toFixed(2):b.toFixed(0))+u[i];}

  // Tooltips for everything with data-tip (timeline boxes, layer strip, bars).
  var tip=document.getElementById('tip');
  document.addEventListener('mousemove',function(ev){
    var t=ev.target.closest?ev.target.closest('[data-tip]'):null;
    if(!t){tip.style.display='none';return;}
    tip.textContent=t.getAttribute('data-tip');tip.style.display='block';
    var x=ev.clientX+14,y=ev.clientY+14;
    if(x+tip.offsetWidth>window.innerWidth)x=ev.clientX-tip.offsetWidth-10;
    if(y+tip.offsetHeight>window.innerHeight)y=ev.clientY-tip.offsetHeight-10;
    tip.style.left=x+'px';tip.style.top=y+'px';
  });

  // Timeline: hovering a box highlights its micro-batch on every stage; toggles for critical path and transfers.
  var tl=document.getElementById('timeline-svg');
  if(tl){
    // One delegated listener (a big plan has tens of thousands of boxes).
    var current=null;
    function clearHighlight(){
      tl.classList.remove('dim');
      tl.querySelectorAll('.ev.hl').forEach(function(o){o.classList.remove('hl');});
    }
    tl.addEventListener('mouseover',function(ev){
      var b=ev.target.closest('.ev[data-mb]'),mb=b?b.getAttribute('data-mb'):null;
      if(mb===current)return;
      clearHighlight();current=mb;
      if(mb===null)return;
      tl.classList.add('dim');
      tl.querySelectorAll('.ev[data-mb="'+mb+'"]').forEach(function(o){o.classList.add('hl');});
    });
    tl.addEventListener('mouseleave',function(){clearHighlight();current=null;});
    var crit=document.getElementById('show-critical');
    crit.addEventListener('change',function(){tl.classList.toggle('crit-on',crit.checked);});
    var xfer=document.getElementById('show-transfers');
    xfer.addEventListener('change',function(){tl.classList.toggle('no-xfer',!xfer.checked);});
  }

  // Layer table: every layer run of every stage, with a filter.
  var holder=document.getElementById('layer-detail');
  var table=document.createElement('table');table.id='layer-table';
  var head='<tr><th class="l">stage</th><th class="l">layer</th><th>tasks</th>'+(data.have_costs?'<th>forward</th><th>params</th>':'')+'</tr>';
  table.innerHTML='<thead>'+head+'</thead>';
  var body=document.createElement('tbody');
  data.stages.forEach(function(s){
    s.layers.forEach(function(l){
      var tr=document.createElement('tr');tr.className='layer-row';tr.setAttribute('data-layer',l.layer);
      var td=function(t,cls){var c=document.createElement('td');if(cls)c.className=cls;c.textContent=t;tr.appendChild(c);return c;};
      var c0=td('','l');var sw=document.createElement('span');sw.className='swatch';sw.style.background=s.colour;c0.appendChild(sw);
      c0.appendChild(document.createTextNode(String(s.id)));
      td(l.layer,'l');td(String(l.tasks));
      if(data.have_costs){td(fmtS(l.forward_s));td(fmtB(l.param_bytes));}
      body.appendChild(tr);
    });
  });
  table.appendChild(body);
  var filter=document.getElementById('layer-filter');
  var count=document.getElementById('layer-count');
  function applyFilter(){
    var q=filter.value.toLowerCase(),n=0;
    body.querySelectorAll('tr').forEach(function(tr){var show=tr.getAttribute('data-layer').toLowerCase().indexOf(q)>=0;tr.style.display=show?'':'none';if(show)n++;});
    count.textContent=n+' of '+body.children.length+' layer runs';
  }
  filter.addEventListener('input',applyFilter);
  var wrap=document.createElement('div');wrap.className='layer-list';wrap.appendChild(table);
  holder.appendChild(wrap);applyFilter();

  // Sortable tables (click a header).
  document.querySelectorAll('table.sortable-table').forEach(function(t){
    t.querySelectorAll('th').forEach(function(th,col){
      th.classList.add('sortable');
      th.addEventListener('click',function(){
        var tb=t.tBodies[0],rows=Array.prototype.slice.call(tb.rows);
        var dir=th.getAttribute('data-dir')==='asc'?-1:1;th.setAttribute('data-dir',dir>0?'asc':'desc');
        rows.sort(function(a,b){
          var x=a.cells[col].getAttribute('data-v'),y=b.cells[col].getAttribute('data-v');
          if(x!==null&&y!==null)return dir*(parseFloat(x)-parseFloat(y));
          return dir*a.cells[col].textContent.localeCompare(b.cells[col].textContent);
        });
        rows.forEach(function(r){tb.appendChild(r);});
      });
    });
  });

  if(document.body.getAttribute('data-rendered')!=='error')document.body.setAttribute('data-rendered','ok');
})();
)JS";

void card(std::ostringstream& out, const std::string& key, const std::string& value, const std::string& note,
          const std::string& id) {
  out << "<div class=\"card\" id=\"" << id << "\"><div class=\"k\">" << esc(key) << "</div><div class=\"v\">"
      << esc(value) << "</div><div class=\"n\">" << esc(note) << "</div></div>\n";
}

void summary_section(std::ostringstream& out, const ReportPlan& p, const sim::SimResult& r) {
  // The plan as its launcher would say it (plan/plan_summary.h), then the figures one card each.
  out << "<section id=\"summary\"><h2>Summary</h2><p id=\"sum-line\">" << esc(plan_summary_line(p.document))
      << "</p><div class=\"cards\">\n";
  int devices_used = 0;
  for (const ReportStage& s : p.stages) devices_used += static_cast<int>(s.devices.size());
  card(out, "predicted iteration", p.iteration_s > 0 ? format_seconds(p.iteration_s) : "not recorded",
       "partition's prediction (simulated)" + (p.pipeline_s ? " (pipeline " + format_seconds(*p.pipeline_s) + ")" : std::string()),
       "sum-iteration");
  std::string sim_note = "event-level replay, " + std::string(schedule_name(r.schedule));
  if (p.iteration_s > 0) sim_note += ", " + num((r.iteration_s / p.iteration_s - 1) * 100, 1) + "% vs partition's prediction";
  card(out, "simulated iteration", format_seconds(r.iteration_s), sim_note, "sum-simulated");
  const double sim_samples = p.global_batch > 0 && r.iteration_s > 0 ? static_cast<double>(p.global_batch) / r.iteration_s : 0;
  card(out, "samples / s", p.samples_per_s > 0 ? num(p.samples_per_s, 1) : "not recorded",
       sim_samples > 0 ? "simulated " + num(sim_samples, 1) : "", "sum-samples");
  const PlanPrediction predicted = p.document.predicted.value_or(PlanPrediction{});
  if (predicted.mfu)
    card(out, "MFU", num(100 * *predicted.mfu, 1) + " %",
         predicted.mfu_flops.value_or("") + "; " + format_tflops(predicted.tflops_per_device.value_or(0)) + " per device" +
             (predicted.tokens_per_s ? "; " + format_rate(*predicted.tokens_per_s) + " tokens/s" : std::string()),
         "sum-mfu");
  else
    card(out, "MFU", "not recorded", "plans before it, or no FLOPs to count", "sum-mfu");
  card(out, "bubble", percent(p.bubble_fraction),
       "bottleneck stage idle share; simulated " + percent(r.bubble_fraction) + " of all devices", "sum-bubble");
  if (p.compute_lower_bound_s && *p.compute_lower_bound_s > 0)
    card(out, "compute lower bound", format_seconds(*p.compute_lower_bound_s),
         "plan is " + num(p.iteration_s / *p.compute_lower_bound_s, 2) + "× the bound", "sum-bound");
  else
    card(out, "compute lower bound", "not recorded", "", "sum-bound");
  card(out, "peak memory", format_bytes(static_cast<double>(p.peak_memory_bytes)),
       p.device_memory_bytes > 0
           ? "of " + format_bytes(static_cast<double>(p.device_memory_bytes)) + " usable per device (" +
                 percent(static_cast<double>(p.peak_memory_bytes) / p.device_memory_bytes) + ")" +
                 (p.device_total_bytes && !p.memory_reserve.empty()
                      ? "; device " + format_bytes(static_cast<double>(*p.device_total_bytes)) + ", --memory-reserve " + p.memory_reserve
                      : std::string())
           : "device limit not recorded",
       "sum-memory");
  card(out, "devices", std::to_string(devices_used) + " of " + std::to_string(p.devices),
       std::to_string(p.stages.size()) + " stages × replicas", "sum-devices");
  card(out, "micro-batches", std::to_string(p.microbatches),
       p.microbatch_size > 0 ? "of " + std::to_string(p.microbatch_size) + " samples, split among a stage's replicas" : "",
       "sum-mb");
  out << "</div></section>\n";
}

// The model as a strip of layer runs, width ∝ forward time (or task count), coloured by stage.
void layer_strip(std::ostringstream& out, const ReportPlan& p) {
  double total = 0;
  bool by_time = p.have_costs;
  for (const ReportStage& s : p.stages)
    for (const LayerRun& l : s.layers) total += l.forward_s;
  if (!(total > 0)) by_time = false;
  auto weight = [&](const LayerRun& l) { return by_time ? l.forward_s : static_cast<double>(l.tasks); };
  if (!by_time) {
    total = 0;
    for (const ReportStage& s : p.stages)
      for (const LayerRun& l : s.layers) total += weight(l);
  }
  if (!(total > 0)) return;
  const double width = 1340, left = 0, strip_y = 26, strip_h = 44;
  out << "<svg id=\"layer-strip\" viewBox=\"0 0 " << width << " 96\" width=\"100%\" role=\"img\" "
      << "aria-label=\"stage layout over the model\">\n";
  double x = left;
  for (const ReportStage& s : p.stages) {
    const double stage_x = x;
    for (const LayerRun& l : s.layers) {
      const double w = weight(l) / total * width;
      std::string tip = "stage " + std::to_string(s.id) + " · " + l.layer + "\n" + std::to_string(l.tasks) + " tasks";
      if (p.have_costs) tip += " · forward " + format_seconds(l.forward_s) + " · " + format_bytes(static_cast<double>(l.param_bytes)) + " params";
      out << "<rect x=\"" << num(x, 2) << "\" y=\"" << strip_y << "\" width=\"" << num(std::max(w, 0.5), 2)
          << "\" height=\"" << strip_h << "\" fill=\"" << stage_colour(s.id) << "\" stroke=\"#fff\" stroke-width=\"0.6\" data-tip=\""
          << esc(tip) << "\"/>\n";
      if (w > 7.5 * static_cast<double>(l.layer.size()) + 6)
        out << "<text x=\"" << num(x + w / 2, 2) << "\" y=\"" << strip_y + strip_h / 2 + 4
            << "\" text-anchor=\"middle\" font-size=\"11\" fill=\"#fff\" pointer-events=\"none\">" << esc(l.layer) << "</text>\n";
      x += w;
    }
    const double sw = x - stage_x;
    out << "<line x1=\"" << num(stage_x + 1, 2) << "\" x2=\"" << num(x - 1, 2) << "\" y1=\"18\" y2=\"18\" stroke=\""
        << stage_colour(s.id) << "\" stroke-width=\"3\"/>\n";
    if (sw > 50)
      out << "<text x=\"" << num(stage_x + sw / 2, 2) << "\" y=\"12\" text-anchor=\"middle\" font-size=\"12\" font-weight=\"600\">stage "
          << s.id << "</text>\n";
    else if (sw > 8.0 * static_cast<double>(std::to_string(s.id).size()) + 2)  // the palette repeats after 10: number every stage that fits
      out << "<text x=\"" << num(stage_x + sw / 2, 2) << "\" y=\"12\" text-anchor=\"middle\" font-size=\"10\">" << s.id
          << "</text>\n";
  }
  out << "<text x=\"0\" y=\"90\" font-size=\"11\" fill=\"#59636e\">model input</text>"
      << "<text x=\"" << width << "\" y=\"90\" font-size=\"11\" fill=\"#59636e\" text-anchor=\"end\">loss</text>"
      << "<text x=\"" << width / 2 << "\" y=\"90\" font-size=\"11\" fill=\"#59636e\" text-anchor=\"middle\">width ∝ "
      << (by_time ? "forward time (costs.json)" : "task count") << "</text>\n</svg>\n";
}

void layout_section(std::ostringstream& out, const ReportPlan& p) {
  out << "<section id=\"layout\"><h2>Stage layout</h2>\n";
  layer_strip(out, p);
  out << "<table id=\"stage-table\"><thead><tr><th class=\"l\">stage</th><th class=\"l\">first layer</th>"
         "<th class=\"l\">last layer</th><th>tasks</th><th>params</th><th>replicas</th><th class=\"l\">devices</th>"
         "<th>forward</th><th>backward</th><th>all-reduce</th><th class=\"l\">memory per device</th></tr></thead><tbody>\n";
  const double bytes_per_param =
      p.model_params > 0 && p.model_param_bytes > 0 ? static_cast<double>(p.model_param_bytes) / p.model_params : kParamStorageBytes;
  for (const ReportStage& s : p.stages) {
    const std::string first = first_layer(s);
    const std::string last = last_layer(s);
    out << "<tr class=\"stage-row\" data-stage=\"" << s.id << "\"" << (s.id == p.bottleneck_stage ? " title=\"bottleneck\"" : "")
        << "><td class=\"l\"><span class=\"swatch\" style=\"background:" << stage_colour(s.id) << "\"></span>" << s.id
        << (s.id == p.bottleneck_stage ? " ★" : "") << "</td><td class=\"l\">" << esc(first) << "</td><td class=\"l\">"
        << esc(last) << "</td><td>" << s.tasks.size() << "</td><td>"
        << (s.param_bytes ? format_count(static_cast<double>(*s.param_bytes) / bytes_per_param) : std::string("-"))
        << "</td><td>" << s.replicas << (s.tp > 1 ? " × TP-" + std::to_string(s.tp) : std::string())
        << "</td><td class=\"l\">" << devices_text(s.devices) << "</td><td>"
        << format_seconds(s.forward_s) << "</td><td>" << format_seconds(s.backward_s)
        << (s.selective ? " (recompute attention)" : s.recompute ? " (recompute)" : "") << "</td><td>" << (s.allreduce_s > 0 ? format_seconds(s.allreduce_s) : std::string("–")) << "</td><td class=\"l\">";
    const double limit = static_cast<double>(p.device_memory_bytes);
    const double used = static_cast<double>(s.memory_bytes);
    const double fraction = limit > 0 ? used / limit : 0;
    const char* colour = fraction < 0.8 ? "#2da44e" : fraction < 0.95 ? "#bf8700" : "#d1242f";
    out << "<span class=\"membar\" data-tip=\"" << esc(format_bytes(used) + " of " + (limit > 0 ? format_bytes(limit) : "?"))
        << "\"><span style=\"width:" << num(std::min(1.0, fraction) * 100, 2) << "%;min-width:2px;background:" << colour
        << "\"></span></span><span class=\"memtext\">" << format_bytes(used)
        << (limit > 0 ? " / " + format_bytes(limit) + " (" + percent(fraction) + ")" : std::string()) << "</span></td></tr>\n";
  }
  out << "</tbody></table>\n<p class=\"note\">★ bottleneck stage. Layers are task-name prefixes up to the first "
         "indexed scope (<code>/h.3/attn/…</code> → <code>h.3</code>); memory is the planner's per-device peak "
         "against the device limit.</p>\n";
  out << "<details><summary>Layers per stage</summary><div class=\"controls\"><input id=\"layer-filter\" "
         "type=\"search\" placeholder=\"filter layers, e.g. h.3\"><span id=\"layer-count\" class=\"note\"></span></div>"
         "<div id=\"layer-detail\"></div></details>\n</section>\n";
}

void timeline_section(std::ostringstream& out, const ReportPlan& p, const sim::SimResult& r, const HtmlOptions& o) {
  out << "<section id=\"timeline\"><h2>Pipeline timeline (one iteration, simulated)</h2>\n";
  out << "<div class=\"controls\"><label><input type=\"checkbox\" id=\"show-critical\"> critical path</label>"
         "<label><input type=\"checkbox\" id=\"show-transfers\" checked> transfers</label><div class=\"legend\">"
         "<span><span class=\"swatch\" style=\"background:hsl(200,70%,75%)\"></span>F forward</span>"
         "<span><span class=\"swatch\" style=\"background:hsl(200,60%,42%)\"></span>B backward (colour = micro-batch)</span>"
         "<span><span class=\"swatch\" style=\"background:#8c959f\"></span>send (activation / gradient)</span>"
         "<span><span class=\"swatch\" style=\"background:repeating-linear-gradient(45deg,#8c959f 0 3px,#57606a 3px 6px)\"></span>all-reduce</span>"
         "<span><span class=\"swatch\" style=\"background:#24292f\"></span>optimizer step</span></div></div>\n";
  const double width = 1340, label_w = 96, right = 14, row_h = 34, lane_h = 9, gap = 10, top = 8, axis_h = 26;
  const double plot_w = width - label_w - right;
  const int stages = static_cast<int>(r.stages.size());
  const double height = top + stages * (row_h + lane_h + gap) + axis_h;
  const double span = r.iteration_s > 0 ? r.iteration_s : 1;
  auto X = [&](double t) { return label_w + t / span * plot_w; };
  auto row_y = [&](int s) { return top + s * (row_h + lane_h + gap); };
  std::vector<bool> on_critical(r.events.size(), false);
  for (int e : r.critical_path) on_critical[static_cast<size_t>(e)] = true;
  const bool only_compute = r.events.size() > o.max_timeline_events;

  out << "<svg id=\"timeline-svg\" class=\"tl\" viewBox=\"0 0 " << width << " " << num(height, 0)
      << "\" width=\"100%\" role=\"img\" aria-label=\"pipeline timeline\">\n"
      << "<defs><pattern id=\"ar\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
         "<rect width=\"6\" height=\"6\" fill=\"#8c959f\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#57606a\" stroke-width=\"3\"/>"
         "</pattern></defs>\n";
  // Rows and grid.
  for (int s = 0; s < stages; ++s) {
    const double y = row_y(s);
    out << "<rect x=\"" << label_w << "\" y=\"" << y << "\" width=\"" << plot_w << "\" height=\"" << row_h
        << "\" fill=\"#f6f8fa\"/>\n<text x=\"" << label_w - 8 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\" font-size=\"12.5\" font-weight=\"600\">"
        << "<tspan fill=\"" << stage_colour(s) << "\">■</tspan> stage " << s << "</text><text x=\"" << label_w - 8 << "\" y=\""
        << y + 29 << "\" text-anchor=\"end\" font-size=\"10.5\" fill=\"#59636e\">dev " << devices_text(r.stages[static_cast<size_t>(s)].devices)
        << "</text>\n<text x=\"" << label_w - 8 << "\" y=\"" << y + row_h + lane_h - 1
        << "\" text-anchor=\"end\" font-size=\"9\" fill=\"#8c959f\">send</text>\n";
  }
  const double step = tick_step(span * 1e3, 10);
  const double axis_y = top + stages * (row_h + lane_h + gap);
  for (double t = 0; t <= span * 1e3 * (1 + 1e-9); t += step) {
    const double x = X(t / 1e3);
    out << "<line x1=\"" << num(x, 2) << "\" x2=\"" << num(x, 2) << "\" y1=\"" << top << "\" y2=\"" << axis_y
        << "\" stroke=\"#d1d9e0\" stroke-width=\"0.6\"/><text x=\"" << num(x, 2) << "\" y=\"" << axis_y + 14
        << "\" text-anchor=\"middle\" font-size=\"10.5\" fill=\"#59636e\">" << num(t, step < 0.01 ? 3 : step < 0.1 ? 2 : step < 1 ? 1 : 0)
        << "</text>\n";
  }
  out << "<text x=\"" << width - right << "\" y=\"" << axis_y + 24 << "\" text-anchor=\"end\" font-size=\"10.5\" fill=\"#59636e\">ms</text>\n";

  // Events.
  for (size_t i = 0; i < r.events.size(); ++i) {
    const sim::SimEvent& e = r.events[i];
    const bool transfer = e.kind == sim::EventKind::kTransfer;
    if (only_compute && transfer) continue;
    const double x0 = X(e.start_s), x1 = X(e.end_s);
    const double w = std::max(x1 - x0, 0.4);
    const double y = transfer ? row_y(e.stage) + row_h + 1 : row_y(e.stage) + 2;
    const double h = transfer ? lane_h - 2 : row_h - 4;
    std::string fill, label, tip;
    const std::string when = format_seconds(e.start_s) + " → " + format_seconds(e.end_s) + " (" + format_seconds(e.end_s - e.start_s) + ")";
    const int hue = microbatch_hue(e.microbatch);
    switch (e.kind) {
      case sim::EventKind::kForward:
        fill = "hsl(" + std::to_string(hue) + ",70%,75%)";
        label = "F" + std::to_string(e.microbatch);
        tip = "stage " + std::to_string(e.stage) + " forward, micro-batch " + std::to_string(e.microbatch);
        break;
      case sim::EventKind::kBackward:
        fill = "hsl(" + std::to_string(hue) + ",60%,42%)";
        label = "B" + std::to_string(e.microbatch);
        tip = "stage " + std::to_string(e.stage) + " backward, micro-batch " + std::to_string(e.microbatch);
        break;
      case sim::EventKind::kBackwardWeight:
        fill = "hsl(" + std::to_string(hue) + ",45%,60%)";
        label = "W" + std::to_string(e.microbatch);
        tip = "stage " + std::to_string(e.stage) + " weight gradient, micro-batch " + std::to_string(e.microbatch);
        break;
      case sim::EventKind::kTransfer:
        fill = e.gradient ? "#57606a" : "#8c959f";
        tip = std::string(e.gradient ? "gradient" : "activation") + " stage " + std::to_string(e.stage) + " → " +
              std::to_string(e.peer_stage) + ", micro-batch " + std::to_string(e.microbatch) + ", " + format_bytes(e.bytes);
        break;
      case sim::EventKind::kAllReduce:
        fill = "url(#ar)";
        label = "all-reduce";
        tip = "stage " + std::to_string(e.stage) + " gradient all-reduce";
        break;
      case sim::EventKind::kStep:
        fill = "#24292f";
        label = "step";
        tip = "stage " + std::to_string(e.stage) + " optimizer step";
        break;
    }
    if (e.virtual_stage != e.stage && !transfer) tip += " (virtual stage " + std::to_string(e.virtual_stage) + ")";
    tip += "\n" + e.name() + " · " + when;
    if (on_critical[i]) tip += "\non the critical path";
    out << "<rect class=\"ev" << (transfer ? " xfer" : "") << (on_critical[i] ? " crit" : "") << "\"";
    if (e.microbatch >= 0) out << " data-mb=\"" << e.microbatch << "\"";
    out << " x=\"" << num(x0, 2) << "\" y=\"" << num(y, 1) << "\" width=\"" << num(w, 2) << "\" height=\"" << h
        << "\" rx=\"1.5\" fill=\"" << fill << "\" data-tip=\"" << esc(tip) << "\"/>\n";
    const double label_w_px = 6.6 * static_cast<double>(label.size()) + 4;
    if (!transfer && w > label_w_px)
      out << "<text x=\"" << num(x0 + w / 2, 2) << "\" y=\"" << num(y + h / 2 + 4, 1) << "\" text-anchor=\"middle\" font-size=\"11\" fill=\""
          << (e.kind == sim::EventKind::kForward ? "#1f2328" : "#fff") << "\" pointer-events=\"none\">" << label << "</text>\n";
  }
  out << "</svg>\n<p class=\"note\">" << p.stages.size() << " stages, " << r.microbatches << " micro-batches, schedule "
      << schedule_name(r.schedule);
  if (r.schedule == Schedule::kInterleaved) out << " (" << r.virtual_stages << " virtual stages per device)";
  out << "; iteration " << format_seconds(r.iteration_s) << ", pipeline " << format_seconds(r.pipeline_s)
      << ", bubble " << percent(r.bubble_fraction) << " (idle share of all devices). Hover a box to highlight its micro-batch. "
      << "Links: " << esc(r.links_source) << ". The same replay as <code>apart simulate</code> (docs/simulator.md).";
  if (only_compute) out << " Transfers are not drawn: " << r.events.size() << " events exceed " << o.max_timeline_events << ".";
  out << "</p>\n</section>\n";
}

void baselines_section(std::ostringstream& out, const ReportPlan& p) {
  out << "<section id=\"baselines\"><h2>Comparison with baselines</h2>\n";
  if (!p.baselines) {
    out << "<p id=\"baselines-missing\">Baselines: not recorded (no <code>baselines.json</code> in the plan directory; "
           "a newer <code>apart partition</code> writes it).</p></section>\n";
    return;
  }
  std::vector<Baseline> rows = *p.baselines;
  const std::string own = p.method.empty() ? "apart" : p.method;
  bool has_own = false;
  for (const Baseline& b : rows) has_own |= b.method == own;
  if (!has_own) {
    Baseline b;
    b.method = own;
    b.iteration_s = p.iteration_s;
    b.samples_per_s = p.samples_per_s;
    b.planning_s = p.search_s;
    b.peak_memory_bytes = static_cast<double>(p.peak_memory_bytes);
    rows.insert(rows.begin(), b);
  }
  if (rows.empty()) {
    out << "<p id=\"baselines-missing\">Baselines: not recorded (baselines.json lists no method).</p></section>\n";
    return;
  }
  double best = 0, longest = 0;
  for (const Baseline& b : rows)
    if (b.feasible && b.iteration_s && *b.iteration_s > 0) {
      best = best > 0 ? std::min(best, *b.iteration_s) : *b.iteration_s;
      longest = std::max(longest, *b.iteration_s);
    }
  out << "<table id=\"baselines-table\" class=\"sortable-table\"><thead><tr><th class=\"l\">method</th><th>iteration</th>"
         "<th>samples/s</th><th>vs best</th><th class=\"l\">feasible</th><th>planning</th><th>peak memory</th></tr></thead><tbody>\n";
  for (const Baseline& b : rows) {
    const bool ok = b.feasible && b.iteration_s && *b.iteration_s > 0;
    out << "<tr class=\"baseline-row" << (b.method == own ? " this" : "") << (ok && *b.iteration_s == best ? " best" : "")
        << "\"><td class=\"l\">" << esc(b.method) << (b.method == own ? " (this plan)" : "") << "</td>";
    auto cell = [&](const std::optional<double>& v, const std::string& text) {
      if (v) out << "<td data-v=\"" << num(*v, 9) << "\">" << text << "</td>";
      else out << "<td data-v=\"1e300\">–</td>";
    };
    cell(ok ? b.iteration_s : std::nullopt, ok ? format_seconds(*b.iteration_s) : "");
    cell(b.feasible ? b.samples_per_s : std::nullopt, b.samples_per_s ? num(*b.samples_per_s, 1) : "");
    cell(ok && best > 0 ? std::optional<double>(*b.iteration_s / best) : std::nullopt,
         ok && best > 0 ? num(*b.iteration_s / best, 2) + "×" : "");
    out << "<td class=\"l\">" << (b.feasible ? "yes" : "no") << "</td>";
    cell(b.planning_s, b.planning_s ? format_seconds(*b.planning_s) : "");
    cell(b.feasible ? b.peak_memory_bytes : std::nullopt, b.peak_memory_bytes ? format_bytes(*b.peak_memory_bytes) : "");
    out << "</tr>\n";
  }
  out << "</tbody></table>\n";
  // Bars: iteration time, shorter is better.
  const double bar_h = 22, label_w = 170, width = 900, value_w = 150;
  const double height = static_cast<double>(rows.size()) * (bar_h + 8) + 10;
  out << "<svg id=\"baselines-bars\" viewBox=\"0 0 " << width << " " << height << "\" width=\"" << width
      << "\" style=\"max-width:100%;margin-top:12px\" role=\"img\" aria-label=\"iteration time per method\">\n";
  double y = 4;
  for (const Baseline& b : rows) {
    const bool ok = b.feasible && b.iteration_s && *b.iteration_s > 0;
    out << "<text x=\"" << label_w - 8 << "\" y=\"" << y + 15 << "\" text-anchor=\"end\" font-size=\"12.5\""
        << (b.method == own ? " font-weight=\"700\"" : "") << ">" << esc(b.method) << "</text>\n";
    if (ok && longest > 0) {
      const double w = *b.iteration_s / longest * (width - label_w - value_w);
      out << "<rect x=\"" << label_w << "\" y=\"" << y << "\" width=\"" << num(std::max(w, 1.0), 2) << "\" height=\"" << bar_h
          << "\" rx=\"3\" fill=\"" << (b.method == own ? "#0969da" : "#8c959f") << "\" data-tip=\""
          << esc(b.method + ": " + format_seconds(*b.iteration_s) + " per iteration") << "\"/>\n<text x=\"" << num(label_w + w + 6, 2)
          << "\" y=\"" << y + 15 << "\" font-size=\"12\">" << format_seconds(*b.iteration_s)
          << (best > 0 && *b.iteration_s > best ? " (" + num(*b.iteration_s / best, 2) + "×)" : "") << "</text>\n";
    } else {
      out << "<text x=\"" << label_w << "\" y=\"" << y + 15 << "\" font-size=\"12\" fill=\"#d1242f\">"
          << (b.feasible ? "no time recorded" : "infeasible") << "</text>\n";
    }
    y += bar_h + 8;
  }
  out << "</svg>\n<p class=\"note\">Iteration time per method under the same cost model (shorter is better); "
         "from <code>baselines.json</code>.</p></section>\n";
}

// The data the script needs, as JSON inside a <script type="application/json">: '<' escaped so that no "</script>"
// can end the block early.
std::string script_data(const ReportPlan& p) {
  json j;
  j["have_costs"] = p.have_costs;
  j["stages"] = json::array();
  for (const ReportStage& s : p.stages) {
    json st = {{"id", s.id}, {"colour", stage_colour(s.id)}, {"layers", json::array()}};
    for (const LayerRun& l : s.layers)
      st["layers"].push_back({{"layer", l.layer}, {"tasks", l.tasks}, {"forward_s", l.forward_s}, {"param_bytes", l.param_bytes}});
    j["stages"].push_back(std::move(st));
  }
  const std::string text = j.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

}  // namespace

std::string html_report(const ReportPlan& p, const sim::SimResult& r, const HtmlOptions& options) {
  std::ostringstream out;
  const std::string model = p.model_path.empty() ? p.source : p.model_path;
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
         "script-src 'unsafe-inline'; img-src data:\">\n<title>apart plan report: "
      << esc(model) << "</title>\n<style>" << kStyle << "</style></head>\n<body data-rendered=\"pending\">\n";
  out << "<header><h1>apart plan report</h1><p class=\"sub\">" << esc(model);
  if (p.model_tasks > 0) out << " (" << p.model_tasks << " tasks, " << format_count(static_cast<double>(p.model_params)) << " params)";
  out << " · " << p.devices << " × " << esc(p.device.empty() ? "device" : p.device) << " (" << p.devices_per_node
      << " per node) · batch " << p.global_batch << " = " << p.microbatches << " micro-batches · " << schedule_name(p.schedule) << " · " << optimizer_name(p.optimizer) << " · " << precision_name(p.precision);
  if (!p.method.empty()) out << " · method " << esc(p.method);
  out << "</p></header>\n<div id=\"errors\" hidden></div>\n<main>\n";
  summary_section(out, p, r);
  layout_section(out, p);
  timeline_section(out, p, r, options);
  baselines_section(out, p);
  out << "</main>\n<footer>Generated by apart " << APART_VERSION << " from " << esc(p.source)
      << " · self-contained: no network access needed.</footer>\n<div id=\"tip\"></div>\n"
      << "<script type=\"application/json\" id=\"apart-data\">" << script_data(p) << "</script>\n<script>" << kScript
      << "</script>\n</body></html>\n";
  return out.str();
}

void write_html_report(const std::filesystem::path& plan_path, const std::filesystem::path& out, const HtmlOptions& options) {
  const ReportPlan plan = load_report_plan(plan_path);
  // Every stage is a row of the layout and of the timeline: past this many the page grows by megabytes per
  // thousand stages and no browser draws it usefully.
  if (plan.stages.size() > static_cast<size_t>(limits::kMaxReportStages))
    throw Unsupported(plan.source + " has " + std::to_string(plan.stages.size()) + " stages; apart report draws at most " +
                      std::to_string(limits::kMaxReportStages) + " (README, Limits): read its report.txt, or "
                      "`apart simulate --json` / `apart viz --format json` for the figures");
  const sim::SimResult result = sim::simulate(plan.sim);
  sim::write_file_atomically(out, html_report(plan, result, options));
}

}  // namespace apart::report
