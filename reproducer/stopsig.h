/* SPDX-License-Identifier: GPL-2.0-only */
/* The VMM's stop signals (SIGTERM, SIGINT) and who sent the first one (stopsig.c). */
#ifndef TRACEKIT_STOPSIG_H
#define TRACEKIT_STOPSIG_H

#include <signal.h>
#include <stdio.h>

/* The signal (SIGTERM or SIGINT) that asked the VMM to stop; 0 while none has. Set last,
 * once the record below is whole. */
extern volatile sig_atomic_t vmm_stop_signal;

/* Install the SIGTERM/SIGINT handler (both blocked while it runs, no SA_RESTART). */
void stop_signals_install(void);

/* The summary's stop fields of the first stop signal, given SIG, the caller's one read
 * of vmm_stop_signal (nothing when 0, so a signal arriving meanwhile cannot add fields
 * to a line that said stopped=0):
 * " stop_signal=S stop_code=C", then for a signal a process sent (SI_USER, SI_QUEUE,
 * SI_TKILL, SI_MESGQ) " stop_pid=P stop_uid=U stop_comm=NAME stop_ppid=PP
 * stop_from_parent=0|1", NAME and PP read from /proc in the handler itself. */
void stop_signals_print(FILE *out, int sig);

#endif
