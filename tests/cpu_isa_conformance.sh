#!/bin/sh
# dray conformance on one CPU kernel set: DRAY_CPU_ISA=SET, run where this CPU
# and build have it (the CPU plugin's describe line in `dray devices -v`, "kernel
# sets here: ..."), skipped (exit 77) where they do not, naming what is missing.
# Usage: cpu_isa_conformance.sh DRAY SET SHOWN   e.g. ... avx512vnni avx512-vnni
dray=$1 set=$2 shown=$3
line=$(DRAY_CPU_ISA= "$dray" devices -v 2>/dev/null | grep 'host CPU: kernel sets here:') || {
    echo "cpu_isa_conformance: no CPU plugin line in 'dray devices -v'" >&2; exit 1; }
here=$(printf '%s\n' "$line" | sed 's/.*kernel sets here://; s/;.*//; s/ ([a-z-]*)//g; s/,/ /g')
case " $here " in
*" $shown "*) ;;
*) echo "kernel set $set: not run here; this CPU runs$here. $(printf '%s\n' "$line" | sed 's/.*lacking: //')"
   exit 77 ;;
esac
out=$(DRAY_CPU_ISA=$set "$dray" conformance --plugin cpu --no-timing 2>&1); rc=$?
printf '%s\n' "$out"
# the run used the set asked for: the device name carries it
printf '%s\n' "$out" | grep -q "^subject:.*($shown)" || { echo "cpu_isa_conformance: the run did not report ($shown)" >&2; exit 1; }
exit $rc
