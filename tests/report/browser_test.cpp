// The report in a real headless browser (Debian's chromium): the script runs without errors, builds the
// interactive parts and marks the page data-rendered="ok"; a screenshot lands in the build folder.
#include <gtest/gtest.h>

#include "tests/report/report_test_util.h"

namespace {

using apart::testing::CommandRun;
using apart::testing::read_text;
using apart::testing::run_command;
namespace fs = std::filesystem;

std::string chromium_binary() {
  for (const char* name : {"chromium", "chromium-browser"})
    if (run_command(std::string("command -v ") + name + " >/dev/null 2>&1").code == 0) return name;
  return "";
}

class AReportInABrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    browser_ = chromium_binary();
    if (browser_.empty()) GTEST_SKIP() << "chromium is not installed (scripts/deps.sh installs it)";
    dir_ = apart::testing::fresh_temp_dir("browser");
    profile_ = dir_ / "profile";  // a fresh user-data-dir per run
    fs::create_directories(profile_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // `timeout 60`: headless chromium can hang; stderr (its log, with page console messages) goes to a file.
  CommandRun chromium(const std::string& action, const fs::path& page) {
    const std::string cmd = "timeout 60 " + browser_ +
        " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking"
        " --disable-component-update --disable-sync --user-data-dir=" + profile_.string() +
        " --enable-logging=stderr --v=0 --virtual-time-budget=5000 " + action + " file://" + fs::absolute(page).string() +
        " 2>" + (dir_ / "chromium.log").string();
    return run_command(cmd);
  }
  fs::path report_of(const fs::path& plan) {
    const fs::path out = dir_ / "report.html";
    const CommandRun r = apart::testing::run_apart("report " + plan.string() + " -o " + out.string());
    EXPECT_EQ(r.code, 0) << r.out;
    return out;
  }
  std::string browser_;
  fs::path dir_;
  fs::path profile_;
};

TEST_F(AReportInABrowser, RunsTheScriptWithoutErrors) {
  const fs::path page = report_of(apart::testing::gpt_tiny_plan(4));
  const CommandRun r = chromium("--dump-dom", page);
  ASSERT_EQ(r.code, 0) << "chromium failed or hung:\n" << read_text(dir_ / "chromium.log");
  const std::string& dom = r.out;
  EXPECT_NE(dom.find("data-rendered=\"ok\""), std::string::npos) << dom.substr(0, 2000);
  // window.onerror writes errors into #errors and un-hides it; it must still be empty and hidden.
  EXPECT_NE(dom.find("<div id=\"errors\" hidden=\"\"></div>"), std::string::npos)
      << dom.substr(std::min(dom.size(), dom.find("id=\"errors\"")), 600);
  // What the script builds: the layer table (one row per layer run) and the filter count.
  EXPECT_NE(dom.find("id=\"layer-table\""), std::string::npos);
  EXPECT_GE(apart::testing::count_of(dom, "class=\"layer-row\""), 4u);
  EXPECT_NE(dom.find("layer runs</span>"), std::string::npos);
  const std::string log = read_text(dir_ / "chromium.log");
  EXPECT_EQ(log.find("Uncaught"), std::string::npos) << log;
}

TEST_F(AReportInABrowser, ShowsScriptErrorsInThePage) {
  // The harness must notice a broken script: break the report's and expect the error in the DOM.
  const fs::path page = report_of(apart::testing::gpt_tiny_plan(2));
  std::string html = read_text(page);
  const size_t at = html.find("var data=JSON.parse(");
  ASSERT_NE(at, std::string::npos);
  html.replace(at, 20, "var data=JSON.parsee(");
  std::ofstream(dir_ / "broken.html") << html;
  const CommandRun r = chromium("--dump-dom", dir_ / "broken.html");
  ASSERT_EQ(r.code, 0) << read_text(dir_ / "chromium.log");
  EXPECT_NE(r.out.find("data-rendered=\"error\""), std::string::npos);
  EXPECT_NE(r.out.find("<div id=\"errors\">script error: "), std::string::npos) << r.out.substr(0, 3000);
}

TEST_F(AReportInABrowser, HighlightsAMicroBatchAndTheCriticalPath) {
  // Drive the page as a person would: hover the first box of micro-batch 0, tick "critical path", filter layers.
  const fs::path page = report_of(apart::testing::gpt_tiny_plan(4, "--microbatches 8"));
  std::string html = read_text(page);
  const size_t mb0 = apart::testing::count_of(html, "data-mb=\"0\"");
  const std::string probe = R"(<script>
    var b=document.querySelector('#timeline-svg .ev[data-mb="0"]');
    b.dispatchEvent(new MouseEvent('mouseover',{bubbles:true}));
    document.body.setAttribute('data-hl',String(document.querySelectorAll('#timeline-svg .ev.hl').length));
    document.getElementById('show-critical').click();
    document.body.setAttribute('data-crit',String(document.getElementById('timeline-svg').classList.contains('crit-on')));
    var f=document.getElementById('layer-filter');f.value='wte';f.dispatchEvent(new Event('input'));
    document.body.setAttribute('data-filtered',document.getElementById('layer-count').textContent);
  </script></body>)";
  html.replace(html.rfind("</body>"), 7, probe);
  std::ofstream(dir_ / "probe.html") << html;
  const CommandRun r = chromium("--dump-dom", dir_ / "probe.html");
  ASSERT_EQ(r.code, 0) << read_text(dir_ / "chromium.log");
  EXPECT_NE(r.out.find("data-hl=\"" + std::to_string(mb0) + "\""), std::string::npos)
      << "every box of micro-batch 0 (" << mb0 << ") highlighted; " << r.out.substr(r.out.find("<body"), 300);
  EXPECT_NE(r.out.find("data-crit=\"true\""), std::string::npos);
  EXPECT_NE(r.out.find("data-filtered=\"1 of "), std::string::npos) << r.out.substr(r.out.find("<body"), 300);
  EXPECT_NE(r.out.find("data-rendered=\"ok\""), std::string::npos);
}

TEST_F(AReportInABrowser, SavesAScreenshot) {
  // 8 micro-batches, so that the timeline has something to show (partition picks 1 for gpt-tiny on 4 stages).
  const fs::path page = report_of(apart::testing::gpt_tiny_plan(4, "--microbatches 8"));
  const fs::path png = fs::path(APART_REPORT_ARTIFACT_DIR) / "report_screenshot.png";
  fs::remove(png);
  // Without --run-all-compositor-stages-before-draw a large SVG can be captured half painted.
  const CommandRun r = chromium("--run-all-compositor-stages-before-draw --screenshot=" + png.string() +
                                " --window-size=1400,1000", page);
  ASSERT_EQ(r.code, 0) << read_text(dir_ / "chromium.log");
  ASSERT_TRUE(fs::exists(png)) << read_text(dir_ / "chromium.log");
  EXPECT_GT(fs::file_size(png), 10u * 1024u);
  const std::string head = read_text(png).substr(0, 8);
  EXPECT_EQ(head, std::string("\x89PNG\r\n\x1a\n", 8));
  std::printf("report screenshot: %s (%ju bytes)\n", png.c_str(), static_cast<uintmax_t>(fs::file_size(png)));
  fs::copy_file(page, fs::path(APART_REPORT_ARTIFACT_DIR) / "report_screenshot.html", fs::copy_options::overwrite_existing);
}

}  // namespace
