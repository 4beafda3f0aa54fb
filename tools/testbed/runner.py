#    Licensed under the Apache License, Version 2.0 (the "License"); you may
#    not use this file except in compliance with the License. You may obtain
#    a copy of the License at
#
#         http://www.apache.org/licenses/LICENSE-2.0
#
#    Unless required by applicable law or agreed to in writing, software
#    distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
#    WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
#    License for the specific language governing permissions and limitations
#    under the License.

"""Run the cinder-dmclone functional tests inside a throw-away guest kernel.

    tools/testbed/run [--backend auto|uml|qemu] [--timeout SECONDS]
                      [--mem 6G] [-- PYTEST_ARGS...]

The host kernel of our machines has no device-mapper, LIO or SCSI, so the
tests in tests/functional run inside Debian's user-mode-linux kernel:

1. tools/testbed/setup-host.sh installs the host packages (no-op when done);
2. tools/testbed/build-rootfs.sh builds or reuses the cached guest rootfs;
3. a per-run directory (printed; outside the repo) gets the run spec: the
   working tree's path and the pytest arguments (NUL-separated, so any
   argument passes through unchanged; nothing goes on the kernel command
   line but that directory's path);
4. the guest boots with the rootfs (read-only, under a tmpfs overlay) as /,
   mounts the working tree read-only at /src and the run directory at
   /testbed/run, builds the two-node topology (tools/testbed/guest/init),
   runs `pytest -v PYTEST_ARGS` (default: tests/functional) with the project
   on PYTHONPATH and powers off;
5. the console streams to stdout as it comes and into <run dir>/console.log;
   the exit status is the guest's pytest status from its final
   "@@TESTBED-RESULT rc=N" line.  124: the guest ran out of --timeout and was
   killed; 125: the guest's setup failed; 126: the guest died without a
   result line; 2: bad usage.

--backend auto (the default) uses user-mode-linux when a two-second probe
boot shows it can run processes on this host, and QEMU otherwise.  Debian's
UML kernel 6.1 saves a process's FPU state in a buffer of 2696 bytes, and a
host whose CPU has larger state (AMX: 11008 bytes) refuses that buffer, so
the guest's first process dies ("ptrace set fp regs failed, errno = 14");
there the runner preloads uml-xstate-shim.so (built once into the cache),
which completes UML's short buffer, and probes again.

--backend qemu boots Debian's own amd64 kernel under QEMU TCG instead
(closer to production: SMP, the distro kernel; slower), with an
out-of-tree dm-clone.ko (tools/testbed/build-qemu-kernel.sh) and the same
rootfs, tree and run directory shared over 9p.

--layout separate (UML only) gives every node its own guest kernel instead
of a network namespace of one: node A and node B boot side by side, joined
by a uml_switch over a unix socket in the run directory (no traffic on the
host's interfaces), each with its own iSCSI initiator and LIO target and
its volume groups on ubd disk files in <run dir>/vgs/<node>, which outlive
the guest.  Node B runs the tests; node A serves commands over the segment
(guest/nodelink).  The control plane (MariaDB, RabbitMQ, etcd, cinder-api,
cinder-scheduler; no device-mapper) runs natively on the host, in a
container of the same root filesystem on the same segment
(tools/testbed/control-plane, node "cp", 10.0.0.10), through the switch's
tap device inside the switch's own network namespace.  The tests may
power node A off hard (its kernel process killed) and boot it again with
the same disks: they write a request file
into <run dir>/ctl (see PowerControl), the runner acts and answers.

Only one testbed runs at a time (the machines have 2 cores): the runner
holds the cache lock while its guests run and waits for it when it is taken.

Environment: DMCLONE_TESTBED_CACHE (default /var/cache/cinder-dmclone/testbed),
DMCLONE_TESTBED_RUNS (default $CACHE/runs), DMCLONE_TESTBED_KEEP_RUNS (20).
"""

import argparse
import collections
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.realpath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
CACHE = os.environ.get('DMCLONE_TESTBED_CACHE',
                       '/var/cache/cinder-dmclone/testbed')
RUNS = os.environ.get('DMCLONE_TESTBED_RUNS', os.path.join(CACHE, 'runs'))
KEEP_RUNS = int(os.environ.get('DMCLONE_TESTBED_KEEP_RUNS', '20'))
DEFAULT_PYTEST_ARGS = ['tests/functional']
#: in a run directory: the volume groups' backing files (--disk-vgs).
VG_DIR = 'vgs'
#: --disk-vgs under UML: each volume group's sparse backing file, in the
#: order of the guest's ubd devices (ubdb, ubdc, ...) that guest/init
#: expects.  UML's own block driver writes straight to the host's file;
#: a loop device over hostfs would first fill the guest's page cache with
#: the backing file's pages.
DISK_VGS = (('dmc-a', 24 * 1024 ** 3), ('dmc-b', 24 * 1024 ** 3),
            ('dmc-b-meta', 1024 ** 3))
#: --layout separate: each node's disks (ubdb, ubdc, ubdd in this order),
#: its Ethernet address on the run's switch.  Node B runs the tests.  The
#: third disk is the VG of the thin backend (tools/testbed/stack/thin.conf,
#: only the thin tests enable it).  16 GiB (a sparse file, like the
#: others): a move's destination still counts a thin volume whole against
#: its pool (Clones.check_thin_pool), so the thin benchmark's 8 GiB volume
#: (tests/bench/test_thin_move.py, issue 19) needs a pool above 8 GiB;
#: overcommitting one stays cheap (only virtual sizes).
THIN_VG_SIZE = 16 * 1024 ** 3
NODE_DISKS = {
    node: (('dmc-%s' % node, 24 * 1024 ** 3),
           ('dmc-%s-meta' % node, 1024 ** 3),
           ('dmc-%s-thin' % node, THIN_VG_SIZE))
    for node in ('a', 'b', 'c')
}
NODE_MAC = {'a': '52:54:00:dc:00:01', 'b': '52:54:00:dc:00:02',
            'c': '52:54:00:dc:00:03'}
TEST_NODE = 'b'
#: --layout separate: the control plane (MariaDB, RabbitMQ, etcd,
#: cinder-api, cinder-scheduler) runs natively in a container on the
#: segment (tools/testbed/control-plane), reached through the switch's
#: tap device; guest/init names it "controller" and node "cp".
CONTROL_IP = '10.0.0.10'
CONTROL_TAP = 'cp0'
#: Nodes that stay off until a test boots them (a power request): the
#: scenarios that need a third node pay for its kernel, the others do not
#: share two CPUs with its idle volume service.
ON_DEMAND = ('c',)
GUEST_SRC = '/src'

RESULT_RE = re.compile(r'@@TESTBED-RESULT rc=(\d+)')
# paths that go on the guest kernel command line must be plain
SAFE_PATH_RE = re.compile(r'^/[A-Za-z0-9._/+-]+$')

RC_TIMEOUT = 124
RC_NO_RESULT = 126
RC_USAGE = 2


def say(msg):
    print('testbed: %s' % msg, flush=True)


def parse_args(argv):
    if '--' in argv:
        i = argv.index('--')
        own, pytest_args = argv[:i], argv[i + 1:]
    else:
        own, pytest_args = argv, []
    p = argparse.ArgumentParser(
        prog='tools/testbed/run',
        usage='%(prog)s [--backend auto|uml|qemu] [--timeout SECONDS] '
              '[--mem SIZE] [--disk-vgs] [--layout one-kernel|separate] '
              '[-- PYTEST_ARGS...]',
        description=__doc__.split('\n\n')[0])
    p.add_argument('--backend', choices=('auto', 'uml', 'qemu'),
                   default='auto')
    p.add_argument('--timeout', type=int, default=1800,
                   help='seconds the guest may run, boot to power-off '
                        '(default: %(default)s)')
    p.add_argument('--mem', default='6G',
                   help='guest memory (default: %(default)s)')
    p.add_argument('--disk-vgs', action='store_true',
                   help='keep the volume groups\' backing files in the run '
                        'directory on the host\'s disk instead of guest '
                        'RAM (the load test writes more than the guest '
                        'holds); removed when the guest stops')
    p.add_argument('--layout', choices=('one-kernel', 'separate'),
                   default='one-kernel',
                   help='one-kernel: node A is a network namespace of the '
                        'test guest; separate: every node is its own '
                        'guest kernel (UML), on one switched segment '
                        '(default: %(default)s)')
    args = p.parse_args(own)
    if args.layout == 'separate' and args.backend == 'qemu':
        p.error('--layout separate runs user-mode-linux guests only')
    if not re.match(r'^[0-9]+[KMG]?$', args.mem):
        p.error('--mem: expected a size like 3G or 2048M')
    args.pytest_args = pytest_args or list(DEFAULT_PYTEST_ARGS)
    return args


def guest_path(arg):
    """Map a host path inside the working tree (or --opt=PATH) to /src."""
    if arg == TREE or arg.startswith(TREE + os.sep):
        return GUEST_SRC + arg[len(TREE):]
    opt, sep, val = arg.partition('=')
    if sep and opt.startswith('-') and (val == TREE or
                                        val.startswith(TREE + os.sep)):
        return opt + '=' + GUEST_SRC + val[len(TREE):]
    return arg


def take_lock():
    os.makedirs(CACHE, exist_ok=True)
    fd = os.open(os.path.join(CACHE, 'lock'), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        say('another testbed build or guest holds %s/lock; waiting' % CACHE)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def build_step(lock_fd, script):
    """Run a build script that prints its product's path last."""
    env = dict(os.environ, DMCLONE_TESTBED_LOCK_FD=str(lock_fd),
               DMCLONE_TESTBED_CACHE=CACHE)
    out = subprocess.run([os.path.join(HERE, script)],
                         check=True, env=env, pass_fds=(lock_fd,),
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def ensure_rootfs(lock_fd):
    subprocess.run([os.path.join(HERE, 'setup-host.sh')], check=True)
    return build_step(lock_fd, 'build-rootfs.sh')


#: the tree's own packages: their bytecode is written on the host (see
#: compile_tree)
COMPILED = ('cinder_dmclone', 'tests')


def compile_tree():
    """Write the bytecode of the tree's packages here, once.

    The guests mount the tree read-only and write no bytecode, so without
    it every Python process of every guest compiles the project's modules
    again under emulation (the volume services, their privsep helpers,
    every worker and node-link call of the tests), where one import of
    Cinder already takes minutes on a slow machine.  The host's Python
    writes files the guests' Python 3.11 uses when it is a 3.11 too
    (Debian 12's, as the rootfs's); another version's files are ignored
    by the guests (and by git, .gitignore).
    """
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, '-m', 'compileall', '-q'] + list(COMPILED),
        cwd=TREE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    if proc.returncode != 0:
        # (a syntax error: the guest's import reports it where it matters)
        say('compileall: %s' % proc.stdout.strip()[-2000:])
    say('bytecode of %s written by Python %d.%d in %.1f s'
        % (', '.join(COMPILED), sys.version_info[0], sys.version_info[1],
           time.monotonic() - t0))


def new_run_dir(pytest_args, disk_vgs=False, layout='one-kernel'):
    os.makedirs(RUNS, exist_ok=True)
    old = sorted(d for d in os.listdir(RUNS) if re.match(r'^\d{8}-\d{6}-', d))
    for d in old[:max(0, len(old) - (KEEP_RUNS - 1))]:
        shutil.rmtree(os.path.join(RUNS, d), ignore_errors=True)
    run_dir = os.path.join(RUNS, time.strftime('%Y%m%d-%H%M%S-') +
                           str(os.getpid()))
    os.makedirs(os.path.join(run_dir, 'spec'))
    with open(os.path.join(run_dir, 'spec', 'tree'), 'w') as f:
        f.write(TREE + '\n')
    with open(os.path.join(run_dir, 'spec', 'pytest-args'), 'wb') as f:
        f.write(b''.join(a.encode() + b'\0' for a in pytest_args))
    with open(os.path.join(run_dir, 'spec', 'layout'), 'w') as f:
        f.write(layout + '\n')
    if layout == 'separate':
        for node, disks in NODE_DISKS.items():
            os.makedirs(os.path.join(run_dir, VG_DIR, node))
            for name, size in disks:
                with open(disk_vg_file(run_dir, name, node), 'wb') as f:
                    f.truncate(size)
        os.makedirs(os.path.join(run_dir, 'ctl'))
    elif disk_vgs:
        os.makedirs(os.path.join(run_dir, VG_DIR))
        for name, size in DISK_VGS:
            with open(disk_vg_file(run_dir, name), 'wb') as f:
                f.truncate(size)
    return run_dir


def disk_vg_file(run_dir, name, node=None):
    if node:
        return os.path.join(run_dir, VG_DIR, node, name + '.img')
    return os.path.join(run_dir, VG_DIR, name + '.img')


class Console:
    """Streams the guest console to stdout and the log, keeps the tail."""

    def __init__(self, stream, log_path, prefix='', echo=None):
        """``echo(line)``: whether a line also goes to stdout (default all)."""
        self.stream = stream
        self.prefix = prefix
        self.echo = echo or (lambda line: True)
        self.log = open(log_path, 'a', encoding='utf-8', errors='replace')
        self.tail = collections.deque(maxlen=60)
        self.result = None
        self.marks = {}
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    MARKS = {
        'stage0': 'stage0: kernel',
        'init': 'guest init started',
        'pytest_start': '] running: pytest',
        'pytest_end': '] pytest finished',
    }

    def _pump(self):
        for raw in iter(self.stream.readline, b''):
            line = raw.decode('utf-8', 'replace').rstrip('\r\n')
            line = line.replace('\r', '')
            now = time.monotonic()
            if self.echo(line):
                sys.stdout.write(self.prefix + line + '\n')
                sys.stdout.flush()
            self.log.write(line + '\n')
            self.log.flush()
            self.tail.append(line)
            for key, needle in self.MARKS.items():
                if key not in self.marks and needle in line:
                    self.marks[key] = now
            m = RESULT_RE.search(line)
            if m:
                self.result = int(m.group(1))
        self.log.close()


def die_with_runner():
    """preexec_fn: the child gets SIGKILL when the runner dies (Linux)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # DEATHSIG


def kill_group(proc, hard=False):
    """End a guest's process group: SIGTERM first unless ``hard``."""
    for sig in ((signal.SIGKILL,) if hard
                else (signal.SIGTERM, signal.SIGKILL)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
    # the kernel process may be gone while its helpers linger
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: what Debian's UML kernel prints when the host refuses its FPU buffer
UML_FP_FAILURE = 'ptrace set fp regs failed'


def uml_runs_processes(rootfs, env=None):
    """Boot UML with /bin/true as init: True if the process ran.

    A working guest panics with exit code 0 of init; a host whose FPU
    state UML cannot restore kills init with SIGSEGV first.  Two seconds.
    """
    with tempfile.TemporaryDirectory(prefix='uml-probe-') as tmp:
        cmd = [shutil.which('linux.uml') or 'linux.uml', 'mem=64M',
               'root=/dev/root', 'rootfstype=hostfs',
               'rootflags=%s' % rootfs, 'ro', 'init=/bin/true',
               'con=null', 'con0=null,fd:1', 'ssl=null', 'panic=-1',
               'umid=probe', 'uml_dir=%s' % tmp]
        try:
            out = subprocess.run(cmd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, timeout=60,
                                 start_new_session=True, env=env).stdout
        except (OSError, subprocess.TimeoutExpired) as exc:
            say('UML probe failed to run: %s' % exc)
            return False
    text = out.decode('utf-8', 'replace')
    return UML_FP_FAILURE not in text and 'exitcode=0x00000000' in text


def xstate_shim():
    """Build (or reuse) uml-xstate-shim.so; its path, or None."""
    source = os.path.join(HERE, 'uml-xstate-shim.c')
    with open(source, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    path = os.path.join(CACHE, 'uml-xstate-shim-%s.so' % digest)
    if not os.path.exists(path):
        tmp = path + '.tmp'
        try:
            subprocess.run(['gcc', '-shared', '-fPIC', '-O2', '-Wall',
                            '-o', tmp, source, '-ldl'], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            say('could not build the UML xstate shim: %s' % exc)
            return None
        os.rename(tmp, path)
    return path


def choose_backend(args, rootfs):
    """The backend to boot, and the environment UML needs (or None)."""
    if args.backend == 'qemu':
        return 'qemu', None
    if uml_runs_processes(rootfs):
        return 'uml', None
    shim = xstate_shim()
    env = dict(os.environ, LD_PRELOAD=shim) if shim else None
    if env and uml_runs_processes(rootfs, env):
        say('user-mode-linux runs with %s (this CPU\'s FPU state is larger '
            'than Debian\'s UML 6.1 saves)' % shim)
        return 'uml', env
    if args.backend == 'uml':
        say('user-mode-linux cannot run processes on this host; trying '
            'anyway as --backend uml asks')
        return 'uml', None
    say('user-mode-linux cannot run processes on this host: using QEMU')
    return 'qemu', None


def uml_command(args, rootfs, run_dir, node=None, switch=None,
                segment=None):
    """The UML command line; ``node``: one node of --layout separate.

    ``switch``: the segment's control socket; ``segment``: the switch's
    network namespace, which the guest joins (:func:`joining`).
    """
    uml_dir = os.path.join(run_dir, 'uml' if node is None else 'uml-' + node)
    os.makedirs(uml_dir, exist_ok=True)
    cmd = [shutil.which('linux.uml') or 'linux.uml', 'mem=%s' % args.mem,
           'root=/dev/root', 'rootfstype=hostfs', 'rootflags=%s' % rootfs,
           # read-only: the guest writes into a tmpfs overlay (see stage0)
           'ro', 'init=/sbin/testbed-stage0',
           'con=null', 'con0=null,fd:1', 'ssl=null', 'panic=-1', 'quiet',
           # only emergencies on the console, from the first line (the
           # guest's init keeps it so: dmesg -n 1); the whole kernel log
           # goes to the run's dmesg*.txt
           'loglevel=1']
    if node is not None:
        return joining(segment, cmd) + [
            'umid=testbed-%s' % node, 'uml_dir=%s' % uml_dir,
            'testbed.run=%s' % run_dir, 'testbed.node=%s' % node,
            'eth0=daemon,%s,unix,%s' % (NODE_MAC[node], switch)] + [
            'ubd%d=%s' % (i, disk_vg_file(run_dir, name, node))
            for i, (name, _) in enumerate(NODE_DISKS[node], 1)]
    return cmd + [
        'umid=testbed', 'uml_dir=%s' % uml_dir,
        'testbed.run=%s' % run_dir] + [
        # ubd0 is the (unused) default; the volume groups start at ubd1
        'ubd%d=%s' % (i, disk_vg_file(run_dir, name))
        for i, (name, _) in enumerate(DISK_VGS, 1) if args.disk_vgs]


def qemu_command(args, rootfs, run_dir, kernel_dir):
    """QEMU TCG (KVM does not work on our machines), 9p shares for all."""
    modules = os.path.join(kernel_dir, 'lib', 'modules')
    release, = os.listdir(modules)

    def share(tag, path, readonly=True):
        return ['-virtfs', 'local,path=%s,mount_tag=%s,security_model='
                'passthrough,multidevs=remap%s'
                % (path, tag, ',readonly=on' if readonly else '')]
    return (['qemu-system-x86_64', '-accel', 'tcg,thread=multi',
             '-cpu', 'max', '-smp', str(os.cpu_count() or 2),
             '-m', args.mem, '-nodefaults', '-no-reboot',
             '-display', 'none', '-monitor', 'none', '-serial', 'stdio',
             '-kernel', os.path.join(kernel_dir, 'vmlinuz'),
             '-initrd', os.path.join(kernel_dir, 'initrd.cpio'),
             '-append', 'console=ttyS0 panic=-1 quiet loglevel=1 '
             'testbed.run=%s' % run_dir]
            + share('root', rootfs)
            + share('modules', os.path.join(modules, release))
            + share('run', run_dir, readonly=False)
            + share('src', TREE))


class SideGuest(object):
    """A node's guest next to the test guest (--layout separate).

    Its console goes to ``console-<node>.log`` (appended across boots);
    its init's progress lines (``@@``) also to stdout, prefixed
    ``<node>| ``.  :meth:`power_off` is a hard
    power-off: the kernel's process group is killed, nothing is synced.
    """

    def __init__(self, node, cmd, run_dir, env=None):
        self.node = node
        self.cmd = cmd
        self.run_dir = run_dir
        self.env = env
        self.proc = None
        self.boots = 0

    def boot(self):
        # a killed UML leaves its umid directory behind
        shutil.rmtree(os.path.join(self.run_dir, 'uml-' + self.node,
                                   'testbed-' + self.node),
                      ignore_errors=True)
        self.boots += 1
        log = os.path.join(self.run_dir, 'console-%s.log' % self.node)
        with open(log, 'a') as f:
            f.write('==== boot %d\n' % self.boots)
        self.proc = subprocess.Popen(
            self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
            cwd=self.run_dir, env=self.env, preexec_fn=die_with_runner)
        self.console = Console(self.proc.stdout, log,
                               prefix='%s| ' % self.node,
                               echo=lambda line: line.startswith('@@'))
        say('node %s booting (boot %d)' % (self.node, self.boots))

    def power_off(self):
        """SIGKILL at once: no exit handler of the guest kernel runs."""
        if self.proc is not None:
            kill_group(self.proc, hard=True)
            self.proc = None
            say('node %s powered off' % self.node)

    def died(self):
        """True once, when the guest ended without being powered off."""
        if self.proc is None or self.proc.poll() is None:
            return False
        say('node %s DIED (exit status %s) without a power-off request; '
            'last console lines (all: console-%s.log):'
            % (self.node, self.proc.returncode, self.node))
        self.console.thread.join(timeout=10)
        for line in self.console.tail:
            print('  %s| %s' % (self.node, line), flush=True)
        self.proc = None
        return True


class PowerControl(object):
    """Power requests from the test guest, through <run dir>/ctl.

    The guest writes ``<id>.request`` (by rename, so it is whole) holding
    ``power-off <node>`` or ``boot <node>``; the runner acts and writes
    ``<id>.done`` holding ``ok`` or the reason it could not.  Waiting for
    the node to be usable again is the guest's business (its nodelink
    answering).
    """

    def __init__(self, run_dir, guests):
        self.dir = os.path.join(run_dir, 'ctl')
        self.guests = guests
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self):
        self.thread.start()

    def stop(self):
        """No request is served after this returns."""
        with self.lock:
            self.stopped.set()

    def _watch(self):
        while not self.stopped.wait(0.5):
            for guest in self.guests.values():
                with self.lock:
                    guest.died()
            for name in sorted(os.listdir(self.dir)):
                if name.endswith('.request'):
                    self._serve(os.path.join(self.dir, name))

    def _serve(self, path):
        with open(path) as f:
            words = f.read().split()
        answer = self.act(words)
        say('power request %s: %s' % (' '.join(words), answer))
        done = path[:-len('.request')] + '.done'
        with open(done + '.tmp', 'w') as f:
            f.write(answer + '\n')
        os.rename(done + '.tmp', done)
        os.unlink(path)

    def act(self, words):
        with self.lock:
            if self.stopped.is_set():
                return 'the run is ending'
            return self._act(words)

    def _act(self, words):
        if len(words) != 2 or words[0] not in ('power-off', 'boot') \
                or words[1] not in self.guests:
            return 'bad request %r (nodes: %s)' % (
                ' '.join(words), ' '.join(sorted(self.guests)))
        action, node = words
        guest = self.guests[node]
        if action == 'power-off':
            guest.power_off()
        elif guest.proc is not None and guest.proc.poll() is None:
            return 'node %s is running' % node
        else:
            guest.boot()
        return 'ok'


#: How many frames the segment's sockets hold for a reader that is slow
#: to drain them.  The switch and every guest exchange frames as unix
#: datagrams, and Linux queues at most net.unix.max_dgram_qlen (10 by
#: default) of them per socket: the switch drops the rest
#: ("send_sock ... Resource temporarily unavailable" in switch.log),
#: tens of thousands in one run.  A guest descheduled for a moment loses
#: every frame past the tenth (the likely cause of stop 32's CI losing
#: node A's TCP connections for half an hour on a slow host).  The
#: sender's socket buffer (about 90 full frames) bounds the queue next.
SEGMENT_QUEUE = 1024


def on_segment(cmd):
    """``cmd`` in a network namespace of its own with a deep datagram queue.

    For the switch: the namespace holds no interface (the segment is the
    switch's unix socket), and its queue length is the one every socket
    created in it gets -- the host's own setting is left alone.  The
    command keeps its process (exec), so killing its process group
    still ends it.
    """
    return ['unshare', '--net', '--', 'sh', '-c',
            'echo %d >/proc/sys/net/unix/max_dgram_qlen && exec "$@"'
            % SEGMENT_QUEUE, 'on-segment'] + list(cmd)


def joining(segment, cmd):
    """``cmd`` in the switch's namespace ``segment`` (a /proc ns path).

    Every guest joins it: UML's daemon transport binds its data socket to
    an abstract address, and abstract addresses are per namespace, so a
    guest elsewhere would not hear the switch.
    """
    if segment is None:
        return list(cmd)
    return ['nsenter', '--net=%s' % segment, '--'] + list(cmd)


def start_switch(run_dir):
    """A uml_switch on a unix socket: the nodes' one network segment.

    Its tap device (:data:`CONTROL_TAP`, in the switch's own namespace)
    is the control-plane node's port on the segment.
    """
    ctl = os.path.join(run_dir, 'switch.ctl')
    log = open(os.path.join(run_dir, 'switch.log'), 'wb')
    proc = subprocess.Popen(on_segment(['uml_switch', '-unix', ctl,
                                        '-tap', CONTROL_TAP]),
                            stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=die_with_runner)
    log.close()
    deadline = time.monotonic() + 30
    while not os.path.exists(ctl):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill_group(proc)
            raise RuntimeError('uml_switch did not create %s (see %s)'
                               % (ctl, os.path.join(run_dir, 'switch.log')))
        time.sleep(0.1)
    return proc, ctl


def start_control_plane(rootfs, run_dir, segment):
    """The control-plane node: a container on the host, on the segment.

    tools/testbed/control-plane in the switch's network namespace and
    namespaces of its own (mount, PID: killing its group ends every
    server in it).  Node B's init waits for its nodelink like node A's.
    Its progress lines (``@@ cp: ...``, a failure's too) are echoed as
    ``cp| ``, the rest only logged (control-plane.log).
    """
    proc = subprocess.Popen(
        joining(segment, ['unshare', '--mount', '--pid', '--uts', '--ipc',
                          '--fork', '--kill-child', '--',
                          'bash', os.path.join(HERE, 'control-plane'),
                          rootfs, run_dir, TREE, CONTROL_IP]),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=die_with_runner)
    Console(proc.stdout, os.path.join(run_dir, 'control-plane.log'),
            prefix='cp| ', echo=lambda line: line.startswith('@@'))
    say('control plane starting natively on the segment (%s; log: '
        'control-plane.log)' % CONTROL_IP)
    return proc


def boot_separate(args, rootfs, run_dir, env=None):
    """Boot every node's guest on one switch; the test guest's status."""
    switch, ctl = start_switch(run_dir)
    segment = '/proc/%d/ns/net' % switch.pid
    guests, power, control = {}, None, None
    try:
        control = start_control_plane(rootfs, run_dir, segment)
        guests = {node: SideGuest(node, uml_command(args, rootfs, run_dir,
                                                    node, ctl, segment),
                                  run_dir, env)
                  for node in sorted(NODE_DISKS) if node != TEST_NODE}
        power = PowerControl(run_dir, guests)
        for node, guest in sorted(guests.items()):
            if node not in ON_DEMAND:
                guest.boot()
        power.start()
        return boot(args, uml_command(args, rootfs, run_dir, TEST_NODE, ctl,
                                      segment), run_dir, env=env)
    finally:
        if power is not None:
            power.stop()
        for guest in guests.values():
            guest.power_off()
        if control is not None:
            kill_group(control, hard=True)
        kill_group(switch, hard=True)


def boot(args, cmd, run_dir, env=None):
    """Run the guest; stream its console; return the exit status."""
    with open(os.path.join(run_dir, 'cmdline'), 'w') as f:
        f.write(' '.join(cmd) + '\n')
    say('booting %s (mem=%s, timeout %d s)'
        % (args.backend, args.mem, args.timeout))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=run_dir, env=env,
                            preexec_fn=die_with_runner)
    console = Console(proc.stdout, os.path.join(run_dir, 'console.log'))
    timed_out = False
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    except KeyboardInterrupt:
        say('interrupted; killing the guest')
        kill_group(proc)
        raise
    finally:
        # also reaps any UML helper process left behind after a power-off
        kill_group(proc)
    console.thread.join(timeout=30)
    wall = time.monotonic() - t0

    marks = console.marks

    def since(a, b):
        if a in marks and b in marks:
            return '%.1f s' % (marks[b] - marks[a])
        return 'n/a'
    marks.setdefault('launch', t0)
    say('timings: boot to stage0 %s, boot to init %s, tests %s, '
        'guest total %.1f s' % (since('launch', 'stage0'),
                                since('launch', 'init'),
                                since('pytest_start', 'pytest_end'), wall))
    if timed_out:
        say('TIMEOUT: the guest ran longer than %d s and was killed; '
            'last console lines above, full log: %s/console.log'
            % (args.timeout, run_dir))
        return RC_TIMEOUT
    if console.result is None:
        say('the guest stopped (exit status %s) without a result '
            'line; last console lines:' % proc.returncode)
        for line in console.tail:
            print('  | ' + line)
        return RC_NO_RESULT
    return console.result


def _interrupted(signum, _frame):
    raise KeyboardInterrupt('signal %d' % signum)


def main(argv):
    # A cancelled CI job or tox sends SIGTERM or SIGHUP: clean up as for
    # Ctrl-C (guests and switch killed), never leave them running.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGHUP, _interrupted)
    args = parse_args(argv)
    pytest_args = [guest_path(a) for a in args.pytest_args]
    t0 = time.monotonic()
    lock_fd = take_lock()
    try:
        rootfs = ensure_rootfs(lock_fd)
        args.backend, uml_env = choose_backend(args, rootfs)
        if args.layout == 'separate' and args.backend != 'uml':
            say('--layout separate needs user-mode-linux, which cannot run '
                'processes on this host')
            return RC_USAGE
        kernel_dir = None
        if args.backend == 'qemu':
            kernel_dir = build_step(lock_fd, 'build-qemu-kernel.sh')
    except subprocess.CalledProcessError as e:
        say('preparing the guest failed: %s' % e)
        return 1
    say('guest images ready in %.1f s (rootfs %s)'
        % (time.monotonic() - t0, rootfs))
    compile_tree()
    run_dir = new_run_dir(pytest_args, args.disk_vgs, args.layout)
    say('run directory: %s' % run_dir)
    for path in (rootfs, run_dir, TREE):
        if not SAFE_PATH_RE.match(path):
            say('path %r is not usable on a kernel command line or in a '
                'QEMU option' % path)
            return RC_USAGE
    try:
        if args.layout == 'separate':
            rc = boot_separate(args, rootfs, run_dir, env=uml_env)
        elif args.backend == 'qemu':
            rc = boot(args, qemu_command(args, rootfs, run_dir, kernel_dir),
                      run_dir)
        else:
            rc = boot(args, uml_command(args, rootfs, run_dir), run_dir,
                      env=uml_env)
    finally:
        # Up to tens of GiB of volume data: never kept with the logs.
        shutil.rmtree(os.path.join(run_dir, VG_DIR), ignore_errors=True)
    say('result rc=%d (run directory: %s, total %.1f s)'
        % (rc, run_dir, time.monotonic() - t0))
    return rc


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
