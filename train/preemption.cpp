// The stop-request flag and the signal handlers behind it (see preemption.h).
#include "train/preemption.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>

#include "graph/atomic_file.h"

namespace apart {
namespace {

std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the flag is set from a signal handler");

constexpr int kStopSignals[] = {SIGTERM, SIGINT, SIGUSR1};
struct sigaction g_previous[3];
struct sigaction g_previous_xfsz;

void say(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;  // nothing to do about stderr from a signal handler
}

extern "C" void on_stop_signal(int signal) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, signal)) {
    say("\napart: ");
    say(stop_signal_name(signal));
    say(" received: finishing this step, then checkpointing (where a --checkpoint-dir is given) and exiting; "
        "send it again to stop at once\n");
    return;
  }
  // The second: at once, as the signal's default action, leaving no temporary that a rename could still name.
  remove_temporaries_from_signal_handler();
  say("\napart: stopped at once by a second signal; the latest complete checkpoint is the previous one\n");
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

}  // namespace

StopSignals::StopSignals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a read or write a signal interrupts goes on; the flag is read between steps
  for (size_t i = 0; i < std::size(kStopSignals); ++i) {
    ::sigaction(kStopSignals[i], &action, &g_previous[i]);
    // A signal ignored when apart started (SIGINT of a background job, nohup) stays ignored.
    if (g_previous[i].sa_handler == SIG_IGN) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGXFSZ, &ignore, &g_previous_xfsz);
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < std::size(kStopSignals); ++i) ::sigaction(kStopSignals[i], &g_previous[i], nullptr);
  ::sigaction(SIGXFSZ, &g_previous_xfsz, nullptr);
}

int stop_requested() { return g_stop_signal.load(); }
void request_stop(int signal) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, signal);
}
void clear_stop_request() { g_stop_signal.store(0); }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a stop signal";
  }
}

}  // namespace apart
