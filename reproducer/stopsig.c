// SPDX-License-Identifier: GPL-2.0-only
/*
 * The VMM's stop signals. The first SIGTERM or SIGINT asks the series to stop (the
 * running VM is torn down in full); everything the summary says about it comes from that
 * one signal: its number, si_code and, when a process sent it, si_pid, si_uid, and the
 * sender's command name and parent, read from /proc right in the handler (open, read and
 * close are async-signal-safe), while the sender most likely still exists. A later stop
 * signal changes nothing. Both signals are blocked while the handler runs, and an atomic
 * flag decides which is first when two threads take one each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "stopsig.h"

volatile sig_atomic_t vmm_stop_signal;

static atomic_flag stop_claimed = ATOMIC_FLAG_INIT;

/* The first stop signal, written once by its handler before vmm_stop_signal. */
static struct {
	int signal;
	int code;
	bool from_process;	/* si_pid and si_uid are meaningful (a process sent it) */
	int pid;
	int uid;
	int ppid;		/* -1: not read */
	bool from_parent;
	char comm[32];		/* "-": not read (gone, or sent from another pid namespace) */
} first;

/* si_codes whose si_pid names a sending process (kill, sigqueue, tgkill, mq_notify). */
static bool sent_by_process(int code)
{
	return code == SI_USER || code == SI_QUEUE || code == SI_TKILL || code == SI_MESGQ;
}

/* "/proc/PID/NAME" into BUF (64 bytes) with no stdio: async-signal-safe. */
static void proc_path(char *buf, int pid, const char *name)
{
	char digits[12];
	int n = 0, at = 0;

	do {
		digits[n++] = (char)('0' + pid % 10);
		pid /= 10;
	} while (pid && n < (int)sizeof(digits));
	memcpy(buf, "/proc/", 6);
	at = 6;
	while (n)
		buf[at++] = digits[--n];
	buf[at++] = '/';
	for (; *name && at < 62; name++)
		buf[at++] = *name;
	buf[at] = '\0';
}

/* Up to SIZE - 1 bytes of a small /proc file, NUL-terminated; its length or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

/* The sender's comm and PPid, read while it most likely still exists. */
static void read_sender(int pid)
{
	char path[64], status[1024], *p;
	ssize_t n;

	proc_path(path, pid, "comm");
	n = read_small(path, first.comm, sizeof(first.comm));
	if (n <= 0) {
		memcpy(first.comm, "-", 2);
	} else if (first.comm[n - 1] == '\n') {
		first.comm[n - 1] = '\0';
	}
	proc_path(path, pid, "status");
	if (read_small(path, status, sizeof(status)) <= 0)
		return;
	for (p = status; *p; p++) {
		if ((p == status || p[-1] == '\n') && strncmp(p, "PPid:", 5) == 0) {
			int ppid = 0;

			for (p += 5; *p == ' ' || *p == '\t'; p++)
				;
			for (; *p >= '0' && *p <= '9'; p++)
				ppid = ppid * 10 + (*p - '0');
			first.ppid = ppid;
			return;
		}
	}
}

/* SIGTERM/SIGINT: the first one is recorded whole, then vmm_stop_signal is set. */
static void on_stop(int sig, siginfo_t *info, void *context)
{
	int saved_errno = errno;

	(void)context;
	if (atomic_flag_test_and_set(&stop_claimed)) {
		errno = saved_errno;
		return;
	}
	first.signal = sig;
	first.code = info->si_code;
	first.ppid = -1;
	memcpy(first.comm, "-", 2);
	if (sent_by_process(info->si_code)) {
		first.from_process = true;
		first.pid = info->si_pid;
		first.uid = (int)info->si_uid;
		first.from_parent = info->si_pid == getppid();
		if (info->si_pid > 0)
			read_sender(info->si_pid);
	}
	/* volatile orders only volatile accesses: the fence keeps the record's stores
	 * before the flag's, for the compiler and for a reader on another CPU */
	atomic_thread_fence(memory_order_release);
	vmm_stop_signal = sig;
	errno = saved_errno;
}

void stop_signals_install(void)
{
	/* no SA_RESTART: KVM_RUN and waits return with EINTR; SA_SIGINFO for the sender */
	struct sigaction stop = { .sa_sigaction = on_stop, .sa_flags = SA_SIGINFO };

	sigemptyset(&stop.sa_mask);
	sigaddset(&stop.sa_mask, SIGTERM);
	sigaddset(&stop.sa_mask, SIGINT);
	sigaction(SIGTERM, &stop, NULL);
	sigaction(SIGINT, &stop, NULL);
}

void stop_signals_print(FILE *out, int sig)
{
	if (!sig)
		return;
	atomic_thread_fence(memory_order_acquire);	/* pairs with on_stop's release */
	fprintf(out, " stop_signal=%d stop_code=%d", first.signal, first.code);
	if (!first.from_process)
		return;
	fprintf(out, " stop_pid=%d stop_uid=%d stop_comm=", first.pid, first.uid);
	fprint_escaped(out, first.comm);
	fprintf(out, " stop_ppid=%d stop_from_parent=%d", first.ppid, first.from_parent ? 1 : 0);
}
