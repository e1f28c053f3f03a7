#!/usr/bin/env bash
# make deb-test: the package installed the way a user installs it. A fresh
# Debian root (debootstrap --variant=minbase) under target/, removed on exit
# even on failure; apt installs target/debian/splitway_*.deb there, resolving
# its dependencies from the mirror; then, inside the root (chroot, in a new
# network namespace so nothing can reach the host's network):
# - the splitway user exists and /etc/splitway is 0750 root:splitway;
# - no unit of the package is enabled and no relay runs;
# - the installed binaries run: `relay --check` on the shipped rc.toml and
#   rs.toml with a key written as the docs say (0640 root:splitway);
# - the man pages and completions are where man and the shells look;
# - `systemd-analyze verify` passes the installed units and every page their
#   Documentation= names is installed;
# - systemd is installed after the package, so its postinst first ran the
#   adduser fallback; run again (dpkg-reconfigure) it creates the user from
#   the sysusers.d entry, and the tmpfiles.d entry sets a key back to 0640
#   root:splitway.
# Usage: deb-test.sh [DEB]   (default: the newest target/debian/splitway_*.deb)
set -euo pipefail
cd "$(dirname "$0")/.."

deb=${1:-$(ls -t target/debian/splitway_*_amd64.deb | head -1)}
suite=${DEB_TEST_SUITE:-bookworm}
mirror=${DEB_TEST_MIRROR:-http://deb.debian.org/debian}
start=$(date +%s)

root=$(mktemp -d "$PWD/target/deb-test.XXXXXX")
cleanup() {
  for m in proc dev/pts dev sys; do
    mountpoint -q "$root/$m" && umount -l "$root/$m"
  done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT

step() { echo "deb-test [$(($(date +%s) - start)) s]: $*"; }
in_root() { unshare --net chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }
# The same in a network namespace with the interface the shipped examples
# intercept on (`eth0`, a veth: this kernel has no dummy links), as a relay
# host has: `--check` refuses an interface that does not exist.
in_root_eth0() {
  unshare --net sh -c 'ip link add eth0 type veth peer name eth0-peer &&
    ip link set eth0 up && ip link set eth0-peer up && shift &&
    exec chroot "$0" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"' \
    "$root" -- "$@"
}
# apt needs the mirror: the only steps run in the host's network namespace.
apt_in_root() { chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive apt-get "$@"; }

step "debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
  || { tail -20 "$root.debootstrap.log"; rm -f "$root.debootstrap.log"; exit 1; }
rm -f "$root.debootstrap.log"
mount -t proc proc "$root/proc"
mount --bind /dev "$root/dev"
# apt's log wants a terminal: a devpts of the root's own.
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"

step "apt install $(basename "$deb")"
cp "$deb" "$root/tmp/"
apt_in_root update -qq
apt_in_root install -y -qq --no-install-recommends "/tmp/$(basename "$deb")"
in_root dpkg-query -W -f='${Package} ${Version} ${Status}\n' splitway nftables iproute2

step "user, modes, nothing enabled"
in_root getent passwd splitway
mode=$(in_root stat -c '%a %U:%G' /etc/splitway)
[ "$mode" = "750 root:splitway" ] || { echo "/etc/splitway is $mode, want 750 root:splitway" >&2; exit 1; }
if find "$root/etc/systemd/system" -name 'splitway*' | grep .; then
  echo "the package enabled a unit" >&2
  exit 1
fi
for f in /usr/bin/splitway /usr/bin/splitway-relay /usr/bin/splitway-tools /usr/bin/splitway-lab \
  /usr/share/man/man8/splitway.8.gz /usr/share/man/man8/splitway-relay.8.gz \
  /usr/share/man/man8/splitway-tools.8.gz /usr/share/man/man8/splitway-lab.8.gz \
  /usr/share/man/man5/splitway.toml.5.gz /usr/share/bash-completion/completions/splitway \
  /usr/share/zsh/vendor-completions/_splitway /usr/share/fish/vendor_completions.d/splitway.fish \
  /usr/lib/sysusers.d/splitway.conf /usr/lib/tmpfiles.d/splitway.conf \
  /usr/lib/sysctl.d/60-splitway-tfo.conf /lib/systemd/system/splitway@.service \
  /lib/systemd/system/splitway-agent.service /usr/share/doc/splitway/copyright; do
  [ -f "$root$f" ] || { echo "missing: $f" >&2; exit 1; }
done
# Every page a unit's Documentation= names is one the package installed.
for page in $(sed -n 's/^Documentation=//p' "$root"/lib/systemd/system/splitway*.service); do
  case $page in
    man:*) name=${page#man:} section=${name##*(} section=${section%)} name=${name%(*}
      [ -f "$root/usr/share/man/man$section/$name.$section.gz" ] \
        || { echo "Documentation=$page: not installed" >&2; exit 1; } ;;
    *) echo "Documentation=$page: not a man page the package installs" >&2; exit 1 ;;
  esac
done
conffiles=$(in_root dpkg-query --control-show splitway conffiles)
echo "$conffiles"
grep -q '^/etc/splitway/rc.toml$' <<<"$conffiles" || { echo "rc.toml is not a conffile" >&2; exit 1; }
for bin in splitway splitway-relay splitway-tools splitway-lab; do
  if file "$root/usr/bin/$bin" | grep -qv ', stripped'; then
    echo "the packaged $bin is not stripped" >&2
    exit 1
  fi
done

step "splitway relay --check on the shipped examples"
in_root sh -c 'splitway keygen > /etc/splitway/psk.key && chown root:splitway /etc/splitway/psk.key && chmod 640 /etc/splitway/psk.key'
for name in rc rs; do
  in_root_eth0 splitway relay --config "/etc/splitway/$name.toml" --check
  in_root_eth0 splitway-relay relay --config "/etc/splitway/$name.toml" --check
done
in_root splitway --version
# The other products' binaries run from the package, with its libraries only.
in_root splitway-tools --version
in_root splitway-tools agent --help >/dev/null
in_root splitway-lab list | grep -q paper-ktcp || { echo "splitway-lab list lacks paper-ktcp" >&2; exit 1; }
# The agent unit runs the host tools' binary, not the front.
grep -q '^ExecStart=/usr/bin/splitway-tools agent enable' "$root/lib/systemd/system/splitway-agent.service" \
  || { echo "splitway-agent.service does not run splitway-tools" >&2; exit 1; }

step "systemd-analyze verify on the installed units"
apt_in_root install -y -qq --no-install-recommends systemd >"$root/tmp/systemd-install.log" 2>&1 \
  || { cat "$root/tmp/systemd-install.log"; exit 1; }
# The template needs an instance whose config exists: rc.
in_root sh -c 'printf "CGROUP=/sys/fs/cgroup/proxied.slice\nROUTES=\n" > /etc/splitway/agent.env'
in_root systemd-analyze verify --man=no /lib/systemd/system/splitway@rc.service /lib/systemd/system/splitway-agent.service

step "sysusers.d and tmpfiles.d entries, now that systemd is there"
# The postinst again, this time creating the user from sysusers.d.
in_root userdel splitway
in_root dpkg-reconfigure splitway
in_root getent passwd splitway
# A key with the wrong mode is set back to 0640 root:splitway.
in_root chmod 600 /etc/splitway/psk.key
in_root systemd-tmpfiles --create /usr/lib/tmpfiles.d/splitway.conf
mode=$(in_root stat -c '%a %U:%G' /etc/splitway/psk.key)
[ "$mode" = "640 root:splitway" ] || { echo "psk.key is $mode after tmpfiles, want 640 root:splitway" >&2; exit 1; }
step "ok: $(basename "$deb") installs into a fresh $suite root and its checks pass"
