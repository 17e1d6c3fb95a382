#!/bin/busybox sh
# /init of the emulated arm64 host: mount everything, load the 9p modules, run the
# command the host left on the control share, record its status there, power off.
# The host reads everything it needs from the control share (/ctl), so the console
# only carries the command's own output between the two marker lines.

export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
/bin/busybox --install -s 2>/dev/null   # applets only where Debian has no binary

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm      # cyclictest and POSIX shm need it
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
hostname vhost

# Debian's libraries live in multiarch directories that only ld.so.cache names.
ldconfig

# virtio-pci and 9p are modules in Debian kernels; the list is in dependency order.
while read -r module; do
    insmod "$module" || echo "tracekit-vhost: cannot load $module" >&2
done < /etc/tracekit/modules

mount_share() {  # tag mountpoint options: one 9p share from the host
    mkdir -p "$2"
    mount -t 9p -o "trans=virtio,version=9p2000.L,msize=262144,cache=none,$3" "$1" "$2"
}
mount_share tkctl /ctl rw || { echo "tracekit-vhost: no control share" >&2; poweroff -f; }
mount_share tkproject /tracekit ro
mount_share tkout /out rw
mount_share tkpyc /var/cache/tracekit-pyc rw
grep -q "tracekit.share=1" /proc/cmdline && mount_share tkshare /share rw

# Facts the host reports: kernel, KVM device, and the boot log (the console is quiet).
{
    echo "kernel_release=$(uname -r)"
    if [ -c /dev/kvm ]; then echo "dev_kvm=yes"; else echo "dev_kvm=no"; fi
    echo "cpus=$(grep -c ^processor /proc/cpuinfo)"
} > /ctl/facts
dmesg > /ctl/boot-dmesg.txt
dmesg -n 1   # keep kernel messages off the console while the command runs

token=$(cat /ctl/token)
echo "@@tracekit-vhost:begin:$token@@"
cd /out
env PYTHONPATH=/tracekit PYTHONPYCACHEPREFIX=/var/cache/tracekit-pyc TRACEKIT_VHOST=1 HOME=/root sh /ctl/command.sh < /dev/null
status=$?
echo "@@tracekit-vhost:end:$token:$status@@"
echo "$status" > /ctl/status
dmesg > /out/vhost-dmesg.txt
sync
poweroff -f
