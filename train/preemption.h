// Stopping a long run politely: SIGTERM, SIGINT and SIGUSR1 (Slurm's --signal) ask `apart train` and every rank of
// `apart run` to finish the step they are in, checkpoint it and exit (docs/training.md "Preemption").
#pragma once

namespace apart {

// While alive, the first SIGTERM, SIGINT or SIGUSR1 only records a stop request (stop_requested()) and says on
// stderr what will happen; a second one of them ends the process at once as that signal's default action does,
// after removing the temporaries of checkpoint files being written (graph/atomic_file.h), so no half-written file
// is ever named the latest. It also ignores SIGXFSZ, so that a file-size limit (ulimit -f) is a failed write the
// writer reports, not a kill that leaves a temporary behind. The previous dispositions come back on destruction.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
};

// The signal of the first stop request (SIGTERM, SIGINT, SIGUSR1, or what request_stop was given), 0 while none.
// Process-wide: the in-process ranks of `apart run` read the same flag, and agree on the step through the step's
// world all-reduce (train/pipeline.cpp), since each reads it at its own time.
int stop_requested();
// What the handler does on a first signal; for tests and embedders that stop a run from code.
void request_stop(int signal);
void clear_stop_request();
// "SIGTERM", "SIGINT", "SIGUSR1", or "signal N".
const char* stop_signal_name(int signal);

}  // namespace apart
