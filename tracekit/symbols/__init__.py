"""Kernel and guest symbols: addresses, hypervisor calls, struct offsets, probe arguments.

Host-side safe: these modules use the stdlib and pyelftools only (never polars), so the
collector can compute probe arguments on a board that holds a vmlinux.
"""
