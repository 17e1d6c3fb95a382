// SPDX-License-Identifier: GPL-2.0-only
/* tlbiprobe's outputs: the binary sample file and the JSON summary with a histogram. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "probe.h"

/* The command-line name of a mode. */
const char *probe_mode_name(enum probe_mode mode)
{
	switch (mode) {
	case MODE_PAGE: return "page";
	case MODE_RANGE: return "range";
	case MODE_MUNMAP: return "munmap";
	}
	return "unknown";
}

/* Write the header, then every sample, to PATH. */
void probe_write_file(const char *path, const struct probe_header *header,
		      const struct probe_sample *samples)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		die(EXIT_USAGE, "--out %s: %s", path, strerror(errno));
	/* The probe only runs on little-endian arm64, so structs are written as they are. */
	if (fwrite(header, sizeof(*header), 1, f) != 1 ||
	    fwrite(samples, sizeof(*samples), header->count, f) != header->count ||
	    fclose(f) != 0)
		die(EXIT_SYSTEM, "--out %s: write failed: %s", path, strerror(errno));
}

/* qsort comparator for durations. */
static int compare_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Nearest-rank percentile P (0-100) of SORTED values. */
static uint64_t percentile(const uint64_t *sorted, uint64_t count, double p)
{
	uint64_t rank = (uint64_t)(p / 100.0 * count + 0.999999999);

	if (rank < 1)
		rank = 1;
	if (rank > count)
		rank = count;
	return sorted[rank - 1];
}

/* log2 bucket of a duration: bucket b holds [2^b, 2^(b+1)) ns; 0 and 1 ns go to 0. */
static int bucket_of(uint64_t ns)
{
	return ns < 2 ? 0 : 63 - __builtin_clzll(ns);
}

/* Print the histogram as a JSON list of non-empty-range buckets from min to max. */
static void print_histogram(FILE *out, const uint64_t *sorted, uint64_t count)
{
	uint64_t buckets[64] = { 0 };
	int first, last;

	for (uint64_t i = 0; i < count; i++)
		buckets[bucket_of(sorted[i])]++;
	first = bucket_of(sorted[0]);
	last = bucket_of(sorted[count - 1]);
	fprintf(out, "[");
	for (int b = first; b <= last; b++)
		fprintf(out, "%s{\"lo_ns\":%llu,\"hi_ns\":%llu,\"count\":%llu}", b > first ? "," : "",
			b ? 1ull << b : 0ull, b < 63 ? 1ull << (b + 1) : UINT64_MAX,
			(unsigned long long)buckets[b]);
	fprintf(out, "]");
}

/* One sync marker as a JSON object, if it was executed. */
static void print_sync(FILE *out, const char *event, const struct gt_sync *sync, bool *first)
{
	if (!sync->t1)
		return;
	fprintf(out, "%s{\"event\":\"%s\",\"cpu\":%d,\"t0\":%llu,\"t1\":%llu}",
		*first ? "" : ",", event, sync->cpu, (unsigned long long)sync->t0,
		(unsigned long long)sync->t1);
	*first = false;
}

/* Print count, percentiles, mean, sync markers and the log2 histogram as one JSON line. */
void probe_print_summary(FILE *out, const struct probe_header *header, const char *helpers,
			 const char *thp, const struct probe_sample *samples,
			 const struct probe_sync *sync)
{
	bool first = true;
	uint64_t count = header->count;
	uint64_t *sorted = malloc((count ? count : 1) * sizeof(*sorted));
	long double sum = 0;

	if (!sorted)
		die(EXIT_SYSTEM, "out of memory for %llu samples", (unsigned long long)count);
	for (uint64_t i = 0; i < count; i++) {
		sorted[i] = samples[i].duration_ns;
		sum += sorted[i];
	}
	qsort(sorted, count, sizeof(*sorted), compare_u64);
	fprintf(out, "{\"record\":\"tlbiprobe\",\"format\":1,\"mode\":\"%s\",\"cpu\":%u,"
		"\"helpers\":\"%s\",\"pages\":%u,\"thp\":\"%s\",\"counter_hz\":%llu,"
		"\"count\":%llu",
		probe_mode_name(header->mode), header->cpu, helpers, header->pages, thp,
		(unsigned long long)header->counter_hz, (unsigned long long)count);
	fprintf(out, ",\"sync\":[");
	print_sync(out, "start", &sync->start, &first);
	print_sync(out, "stop", &sync->stop, &first);
	fprintf(out, "]");
	if (count) {
		fprintf(out, ",\"min_ns\":%llu,\"p50_ns\":%llu,\"p90_ns\":%llu,\"p99_ns\":%llu,"
			"\"p99_9_ns\":%llu,\"max_ns\":%llu,\"mean_ns\":%.1Lf,\"histogram\":",
			(unsigned long long)sorted[0],
			(unsigned long long)percentile(sorted, count, 50),
			(unsigned long long)percentile(sorted, count, 90),
			(unsigned long long)percentile(sorted, count, 99),
			(unsigned long long)percentile(sorted, count, 99.9),
			(unsigned long long)sorted[count - 1], sum / count);
		print_histogram(out, sorted, count);
	}
	fprintf(out, "}\n");
	free(sorted);
}
