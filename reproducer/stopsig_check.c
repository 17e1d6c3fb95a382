// SPDX-License-Identifier: GPL-2.0-only
/*
 * stopsig-check [LINGER_MS]: the VMM's stop-signal record on its own, for the tests. It
 * installs the VMM's handler, prints "ready", waits for a stop signal, then LINGER_MS
 * more (for a second one, which must change nothing), and prints the summary's stop
 * fields as the VMM does.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "stopsig.h"

static void sleep_ms(long ms)
{
	struct timespec pause = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&pause, &pause))
		;
}

int main(int argc, char **argv)
{
	long linger_ms = argc > 1 ? strtol(argv[1], NULL, 10) : 0;

	stop_signals_install();
	printf("ready\n");
	fflush(stdout);
	while (!vmm_stop_signal)
		sleep_ms(5);
	sleep_ms(linger_ms);
	printf("record=summary vms=0 ok=0 stopped=1");
	stop_signals_print(stdout, vmm_stop_signal);
	printf("\n");
	return 0;
}
