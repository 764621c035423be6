/* A native backtrace when a process crashes, for machines without gdb (the GPU machine):
 * LD_PRELOAD=segv_backtrace.so python ...  prints the crashing thread's frames to stderr
 * (library and offset, for addr2line), then lets the signal kill the process as before.
 * Python's faulthandler, installed later, dumps the Python stack first and then re-raises
 * into this handler. Built and used by scripts/nccl_probe.py. */
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void print_backtrace(int sig) {
  static const char header[] = "native backtrace (segv_backtrace):\n";
  void* frames[64];
  const int count = backtrace(frames, 64);
  (void)sig;
  if (write(2, header, sizeof header - 1) < 0) return;
  backtrace_symbols_fd(frames, count, 2);
}

static void on_fatal_signal(int sig) {
  print_backtrace(sig);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_fatal_signal;
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGSEGV, &action, 0);
  sigaction(SIGBUS, &action, 0);
  sigaction(SIGILL, &action, 0);
  sigaction(SIGFPE, &action, 0);
  sigaction(SIGABRT, &action, 0); /* std::terminate, failed assertions */
}
