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

"""Helpers for the tests that run inside the testbed guest (every suite).

Everything here runs real commands against the guest's kernel (LVM,
device-mapper, LIO, open-iscsi) and uses only the standard library, so the
same helpers serve the plain-command smoke tests and the tests that drive
the project's code.  The topology comes from the guest init
(tools/testbed/guest/init), see :func:`topology`.

Node B is the initial network namespace: the pytest process itself.  Node A
is network namespace ``nodeA``: commands go there with ``run(..., node='a')``
and Python code with :class:`tests.harness.workers.NodeProcess`.
"""

import dataclasses
import glob
import hashlib
import json
import logging
import mmap
import os
import random
import re
import subprocess
import time

LOG = logging.getLogger('testbed')

TOPOLOGY_PATH = '/run/testbed/topology.json'
LIO_ROOT = '/sys/kernel/config/target'
SECTOR = 512
KiB = 1024
MiB = 1024 * KiB


# --------------------------------------------------------------------------
# Topology
# --------------------------------------------------------------------------

def in_testbed():
    """True inside the testbed guest (its init wrote the topology)."""
    return os.path.exists(TOPOLOGY_PATH)


@dataclasses.dataclass(frozen=True)
class Node:
    key: str              # 'a', 'b' or 'c' (separate layout only)
    name: str             # 'node-a' ... (cinder host names)
    hostname: str
    netns: object         # 'nodeA', or None for the initial namespace
    ip: str
    exec_prefix: tuple    # argv prefix that runs a command on this node
    vg: str
    initiator_iqn: object
    meta_vg: object = None
    target_iqn_prefix: object = None
    #: off until a test boots it (separate layout: node C)
    on_demand: bool = False
    #: the thin backend's VG (separate layout; see stack/thin.conf)
    thin_vg: object = None

    @property
    def portal(self):
        return '%s:%d' % (self.ip, topology().iscsi_port)


@dataclasses.dataclass(frozen=True)
class Topology:
    raw: dict
    a: Node
    b: Node
    lvm_conf: str
    lvm_system_dir: str
    python: str
    src: str
    artifacts_dir: str
    iscsi_port: int
    layout: str = 'one-kernel'
    #: every node by key, on-demand ones included
    nodes: dict = dataclasses.field(default_factory=dict)
    #: where the control plane's servers run (MariaDB, RabbitMQ, etcd,
    #: cinder-api, cinder-scheduler): node "cp" natively on the host
    #: (separate layout, tools/testbed/control-plane), else node B
    control: Node = None

    def node(self, key):
        """Node ``key`` ('a', 'node-a', ...; 'cp': the control plane)."""
        if key == CONTROL_KEY:
            return self.control
        return self.nodes[key.lower()[-1]]

    @property
    def separate(self):
        """True when every node is its own kernel (--layout separate)."""
        return self.layout == 'separate'

    @property
    def kernels(self):
        """One node key per kernel: whose view covers each kernel's state.

        On-demand nodes are not among them: the test that boots one checks
        it (:func:`snapshot` with ``kernels``).
        """
        return ('a', 'b') if self.separate else ('b',)


_TOPOLOGY = None
#: the control plane's node key (:attr:`Topology.control`) when it runs
#: on a node of its own
CONTROL_KEY = 'cp'


def _control_node(raw, node_b):
    """The control plane's :class:`Node`: its own, or node B's."""
    if raw is None:
        return node_b
    return Node(key=raw['key'], name=raw['name'], hostname=raw['hostname'],
                netns=None, ip=raw['ip'], exec_prefix=tuple(raw['exec']),
                vg=None, initiator_iqn=None)


def topology():
    """The testbed description written by the guest init (cached)."""
    global _TOPOLOGY
    if _TOPOLOGY is None:
        with open(TOPOLOGY_PATH) as f:
            raw = json.load(f)
        nodes = {}
        for key, n in raw['nodes'].items():
            nodes[key] = Node(
                key=key, name=n['name'], hostname=n['hostname'],
                netns=n['netns'], ip=n['ip'], exec_prefix=tuple(n['exec']),
                vg=n['vg'], initiator_iqn=n['initiator_iqn'],
                meta_vg=n.get('meta_vg'),
                target_iqn_prefix=n.get('target_iqn_prefix'),
                on_demand=n.get('on_demand', False),
                thin_vg=n.get('thin_vg'))
        _TOPOLOGY = Topology(
            raw=raw, a=nodes['a'], b=nodes['b'], lvm_conf=raw['lvm_conf'],
            lvm_system_dir=raw['lvm_system_dir'], python=raw['python'],
            src=raw['src'], artifacts_dir=raw['artifacts_dir'],
            iscsi_port=raw['iscsi_port'],
            layout=raw.get('layout', 'one-kernel'), nodes=nodes,
            control=_control_node(raw.get('control_plane'), nodes['b']))
    return _TOPOLOGY


# --------------------------------------------------------------------------
# Commands and waiting
# --------------------------------------------------------------------------

class CommandError(subprocess.CalledProcessError):
    def __str__(self):
        return '%s\n--- stdout:\n%s--- stderr:\n%s' % (
            super().__str__(), self.stdout or '', self.stderr or '')


def run(cmd, node=None, input=None, check=True, timeout=300, env=None):
    """Run a command on a node ('a', 'b', ...); return the CompletedProcess.

    ``node`` None: on this process's kernel (:func:`local_node`; node B's
    in the tests' own process, node A's in a worker on node A's kernel),
    so that a helper which names no node looks at the kernel of whatever
    runs it (``Cluster.on_node``).  Output is captured as text and
    logged; a non-zero exit raises :class:`CommandError` (with stdout and
    stderr) unless ``check=False``.
    """
    if node is None:
        node = local_node()
    argv = [str(c) for c in cmd]
    prefix = (list(topology().node(node).exec_prefix)
              if node != local_node() else [])
    LOG.info('[node %s] $ %s', node.upper(), ' '.join(argv))
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    proc = subprocess.run(prefix + argv, input=input, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
    if proc.stdout.strip():
        LOG.debug('stdout: %s', proc.stdout.rstrip())
    if proc.stderr.strip():
        LOG.debug('stderr: %s', proc.stderr.rstrip())
    if check and proc.returncode != 0:
        raise CommandError(proc.returncode, prefix + argv, proc.stdout,
                           proc.stderr)
    return proc


def read_text(path, node='b'):
    """The text of file ``path`` on ``node``'s kernel; '' if it is missing."""
    if topology().separate and node != local_node():
        return run(['cat', path], node=node, check=False).stdout
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ''


class WaitTimeout(AssertionError):
    pass


def wait_until(predicate, timeout, what, interval=0.25, diagnostics=None):
    """Poll ``predicate`` until it returns something true; return that.

    Bounded: after ``timeout`` seconds raise :class:`WaitTimeout` naming
    ``what``, the last value seen and the output of ``diagnostics()``.
    """
    start = time.monotonic()
    deadline = start + timeout
    while True:
        value = predicate()
        if value:
            LOG.info('%s after %.1f s', what, time.monotonic() - start)
            return value
        if time.monotonic() >= deadline:
            diag = ''
            if diagnostics is not None:
                try:
                    diag = diagnostics()
                except Exception as exc:
                    diag = 'diagnostics failed: %r' % exc
            raise WaitTimeout('timed out after %d s waiting for %s; last '
                              'value %r\n%s' % (timeout, what, value, diag))
        time.sleep(interval)


def netem_on_port(dev, port, netem_args):
    """tc commands: netem ``netem_args`` on ``dev``'s TCP ``port`` only.

    For a device that carries other traffic too (between separate
    kernels: the harness's commands, the database): a ``prio`` root
    with a fourth band that no priority maps to, netem on that band, and
    u32 filters that send it the packets from or to ``port``.  Run them
    on a device without a root qdisc (``tc qdisc del dev DEV root``
    removes it all).
    """
    band = '1:4'
    commands = [['tc', 'qdisc', 'add', 'dev', dev, 'root', 'handle', '1:',
                 'prio', 'bands', '4']]
    for direction in ('sport', 'dport'):
        commands.append(['tc', 'filter', 'add', 'dev', dev, 'parent', '1:',
                         'protocol', 'ip', 'prio', '1', 'u32', 'match',
                         'ip', direction, str(port), '0xffff',
                         'flowid', band])
    commands.append(['tc', 'qdisc', 'add', 'dev', dev, 'parent', band,
                     'handle', '40:', 'netem'] + list(netem_args))
    return commands


def kernel_log(lines=40):
    return run(['dmesg'], check=False).stdout.splitlines()[-lines:]


# --------------------------------------------------------------------------
# Data: patterns, direct I/O, checksums
# --------------------------------------------------------------------------

def pattern(seed, size):
    """Deterministic pseudo-random bytes (a different stream per seed)."""
    return random.Random(seed).randbytes(size)


def device_size(path):
    """Size of a block device (or file) in bytes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_END)
    finally:
        os.close(fd)


def _check_aligned(offset, length):
    if offset % SECTOR or length % SECTOR:
        raise ValueError('direct I/O needs 512-byte alignment: offset %d '
                         'length %d' % (offset, length))


def write_direct(path, offset, data, chunk=MiB):
    """Write ``data`` at ``offset`` with O_DIRECT (bypassing page cache)."""
    _check_aligned(offset, len(data))
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
    try:
        done = 0
        while done < len(data):
            n = min(chunk, len(data) - done)
            view = memoryview(buf)[:n]
            view[:] = data[done:done + n]
            written = os.pwritev(fd, [view], offset + done)
            view.release()
            if written != n:
                raise IOError('short write to %s at %d: %d of %d'
                              % (path, offset + done, written, n))
            done += n
        os.fsync(fd)
    finally:
        buf.close()
        os.close(fd)


def iter_direct(path, offset=0, length=None, chunk=MiB):
    """Yield the bytes of ``path`` in chunks, read with O_DIRECT."""
    if length is None:
        length = device_size(path) - offset
    _check_aligned(offset, length)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, chunk)
    try:
        done = 0
        while done < length:
            n = min(chunk, length - done)
            # Released even when the read fails (EIO), or closing the
            # buffer below would raise BufferError over the real error.
            with memoryview(buf) as whole, whole[:n] as view:
                got = os.preadv(fd, [view], offset + done)
            if got != n:
                raise IOError('short read from %s at %d: %d of %d'
                              % (path, offset + done, got, n))
            yield buf[:n]
            done += n
    finally:
        buf.close()
        os.close(fd)


def read_direct(path, offset, length):
    return b''.join(iter_direct(path, offset, length))


def sha256_of_device(path, length=None, offset=0):
    """sha256 hex digest of a device's content, read with O_DIRECT."""
    h = hashlib.sha256()
    for block in iter_direct(path, offset, length):
        h.update(block)
    return h.hexdigest()


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def write_pattern(path, seed, length, offset=0):
    """Write ``pattern(seed, length)`` at ``offset``; return the data."""
    data = pattern(seed, length)
    write_direct(path, offset, data)
    return data


def write_pattern_digest(path, seed, length, offset=0):
    """:func:`write_pattern`, returning the data's sha256.

    For a call on another node: the digest travels back, not the data.
    """
    return sha256(write_pattern(path, seed, length, offset))


# --------------------------------------------------------------------------
# LVM
# --------------------------------------------------------------------------

def lvm(*args, **kwargs):
    """Run an ``lvm`` command (the guest's lvm.conf is the testbed's)."""
    return run(['lvm'] + list(args), **kwargs)


def lv_path(vg, lv):
    return '/dev/%s/%s' % (vg, lv)


def kernel_of(vg):
    """The node whose kernel holds volume group ``vg`` (a node key).

    Separate kernels: the node the topology gives ``vg`` (its data,
    metadata or thin VG).  One kernel: this process's node, which sees
    every VG.
    """
    topo = topology()
    if not topo.separate:
        return local_node()
    for key, node in sorted(topo.nodes.items()):
        if vg in (node.vg, node.meta_vg, node.thin_vg):
            return key
    raise ValueError('volume group %s belongs to no node' % vg)


def path_exists(path, node='b'):
    """True when ``path`` exists on ``node``'s kernel."""
    if topology().separate and node != local_node():
        return run(['test', '-e', path], node=node, check=False
                   ).returncode == 0
    return os.path.exists(path)


def create_lv(vg, name, size_bytes, node='b'):
    """An LV of ``vg``, made on ``node`` (see :func:`kernel_of`)."""
    lvm('lvcreate', '-q', '-y', '-n', name, '-L', '%db' % size_bytes, vg,
        node=node)
    path = lv_path(vg, name)
    wait_until(lambda: path_exists(path, node), 30,
               'device node %s' % path)
    return path


def remove_lv(vg, name, missing_ok=True, node='b'):
    if missing_ok and '%s/%s' % (vg, name) not in list_lvs(node):
        return
    lvm('lvremove', '-q', '-f', '%s/%s' % (vg, name), node=node)


def list_lvs(node=None):
    """{'vg/lv', ...} of every logical volume (of ``node``'s kernel).

    ``node`` None: this process's kernel (see :func:`run`).
    """
    out = lvm('lvs', '--noheadings', '-o', 'vg_name,lv_name',
              '--separator', '/', node=node).stdout
    return {line.strip() for line in out.splitlines() if line.strip()}


#: the columns of :func:`lv_report`, in this order
LV_REPORT = ('lv_name', 'segtype', 'pool_lv', 'lv_size', 'data_percent')


def lv_report(vg, node=None):
    """{LV name: {column: text}} of ``vg``'s LVs (:data:`LV_REPORT`).

    Sizes in bytes; ``data_percent`` is a thin LV's (or a pool's) mapped
    share, empty for a thick LV.  On ``node``'s kernel (None: this
    process's); hidden LVs (a pool's data and metadata) are not listed.
    """
    out = lvm('lvs', '--noheadings', '--nosuffix', '--units', 'b',
              '--separator', '|', '-o', ','.join(LV_REPORT), vg,
              node=node, env={'LC_ALL': 'C'}).stdout
    report = {}
    for line in out.splitlines():
        if line.strip():
            fields = [f.strip() for f in line.split('|')]
            report[fields[0]] = dict(zip(LV_REPORT, fields))
    return report


def lv_pe_ranges(vg, name):
    """['<pv>:<first>-<last>', ...]: the physical extents an LV occupies."""
    out = lvm('lvs', '--noheadings', '-o', 'seg_pe_ranges',
              '%s/%s' % (vg, name)).stdout
    return [r for line in out.splitlines() for r in line.split()]


def create_lv_on_extents(vg, name, pe_ranges):
    """An LV over exactly ``pe_ranges`` (as :func:`lv_pe_ranges` gives).

    Neither zeroed nor wiped of signatures by LVM (``-Zn -Wn``): it reads
    whatever those extents hold.
    """
    extents = 0
    for pe_range in pe_ranges:
        first, _, last = pe_range.rpartition(':')[2].partition('-')
        extents += int(last) - int(first) + 1
    lvm(*(['lvcreate', '-q', '-y', '-Zn', '-Wn', '-n', name,
           '-l', str(extents), vg] + list(pe_ranges)))
    path = lv_path(vg, name)
    wait_until(lambda: os.path.exists(path), 30, 'device node %s' % path)
    return path


def zero_device(path, length):
    write_direct(path, 0, bytes(length))


# --------------------------------------------------------------------------
# Device-mapper (plain dmsetup, no project code)
# --------------------------------------------------------------------------

def dm_devices():
    """{name: uuid} of every device-mapper device."""
    out = run(['dmsetup', 'info', '-c', '--noheadings', '-o', 'name,uuid',
               '--separator', '|']).stdout
    devices = {}
    for line in out.splitlines():
        if '|' in line:
            name, _, uuid = line.strip().partition('|')
            devices[name] = uuid
    return devices


def dm_remove(name, missing_ok=True):
    if missing_ok and name not in dm_devices():
        return
    run(['dmsetup', 'remove', name])


def dm_devno(path):
    """'major:minor' of a block device, as device-mapper tables show it."""
    rdev = os.stat(path).st_rdev
    return '%d:%d' % (os.major(rdev), os.minor(rdev))


def dm_status(name):
    return run(['dmsetup', 'status', name]).stdout.strip()


def dm_table(name):
    return run(['dmsetup', 'table', name]).stdout.strip()


def clone_progress(name):
    """(hydrated, total) regions of a single-segment clone device."""
    fields = dm_status(name).split()
    if len(fields) < 7 or fields[2] != 'clone':
        raise AssertionError('%s is not a clone: %r' % (name, fields))
    hydrated, total = fields[6].split('/')
    return int(hydrated), int(total)


def wait_hydrated(name, timeout=600):
    """Wait until every region of clone device ``name`` is hydrated."""
    def done():
        hydrated, total = clone_progress(name)
        return hydrated == total

    def diagnostics():
        return '\n'.join(['dmsetup status %s: %s' % (name, dm_status(name)),
                          'dmsetup table %s: %s' % (name, dm_table(name)),
                          'iSCSI sessions: %s' % iscsi_sessions(),
                          'kernel log:'] + kernel_log(20))
    return wait_until(done, timeout, 'clone %s hydrated' % name,
                      interval=0.5, diagnostics=diagnostics)


# --------------------------------------------------------------------------
# LIO on node A (targetcli) and open-iscsi on node B (iscsiadm)
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class IscsiExport:
    target_iqn: str
    portal: str           # 'ip:port'
    lun: int
    backstore: str        # LIO block backstore (storage object) name
    device: str           # exported block device on node A
    initiator_iqn: str    # the only initiator allowed (ACL)

    def connection_properties(self):
        """os-brick ISCSIConnector properties for this export (no CHAP)."""
        return {'target_discovered': False, 'target_portal': self.portal,
                'target_iqn': self.target_iqn, 'target_lun': self.lun,
                'volume_id': self.backstore}


def targetcli(commands, node='a'):
    """Run targetcli commands in one batch on ``node`` (default node A).

    targetcli-fb's batch mode exits 0 even when a command failed: callers
    must check the resulting state in configfs, as the helpers below do.
    """
    script = ['set global auto_save_on_exit=false color_mode=false '
              'auto_add_default_portal=false auto_add_mapped_luns=true']
    script += list(commands) + ['exit']
    return run(['targetcli'], node=node, input='\n'.join(script) + '\n')


def target_iqn(owner, name):
    """The IQN of export ``name`` on node ``owner``; refuses bad names.

    (IQNs take lower-case letters, digits, '-', '.' and ':'; targetcli
    reports a bad one only as text, see :func:`targetcli`.)
    """
    iqn = '%s:%s' % (owner.target_iqn_prefix, name)
    if not re.match(r'^iqn\.[0-9]{4}-[0-9]{2}\.[a-z0-9.-]+:[a-z0-9.:-]+$',
                    iqn):
        raise ValueError('%r is not a valid IQN: use lower-case letters, '
                         'digits, "-" and "." in export names' % iqn)
    return iqn


def lio_tpg_path(target_iqn, tpg=1):
    return '%s/iscsi/%s/tpgt_%d' % (LIO_ROOT, target_iqn, tpg)


def export_iscsi(device, name, initiator_iqn=None, node='a'):
    """Export ``device`` from node A over iSCSI with targetcli.

    One target per export (IQN ``<node A prefix>:<name>``), LUN 0, portal
    on node A's address only, an ACL for the initiator (default: node B).
    """
    topo = topology()
    owner = topo.node(node)
    initiator_iqn = initiator_iqn or topo.b.initiator_iqn
    iqn = target_iqn(owner, name)
    export = IscsiExport(iqn, owner.portal, 0, name, device, initiator_iqn)
    out = targetcli([
        '/backstores/block create name=%s dev=%s' % (name, device),
        '/iscsi create %s' % iqn,
        '/iscsi/%s/tpg1/portals create %s %d' % (iqn, owner.ip,
                                                 topo.iscsi_port),
        '/iscsi/%s/tpg1/luns create /backstores/block/%s' % (iqn, name),
        '/iscsi/%s/tpg1/acls create %s' % (iqn, initiator_iqn),
    ], node=node)
    tpg = lio_tpg_path(iqn)
    expected = [tpg + '/np/' + export.portal, tpg + '/lun/lun_0',
                tpg + '/acls/%s/lun_0' % initiator_iqn]
    missing = [p for p in expected if not os.path.exists(p)]
    if missing:
        raise AssertionError('targetcli left the export incomplete, missing '
                             '%s\n%s%s' % (missing, out.stdout, out.stderr))
    return export


def unexport_iscsi(export, node='a', missing_ok=True):
    if missing_ok and not _lio_has(export):
        return
    out = targetcli(['/iscsi delete %s' % export.target_iqn,
                     '/backstores/block delete %s' % export.backstore],
                    node=node)
    left = [p for p in lio_storage_objects()
            if os.path.basename(p) == export.backstore]
    if os.path.exists(LIO_ROOT + '/iscsi/' + export.target_iqn):
        left.append(LIO_ROOT + '/iscsi/' + export.target_iqn)
    if left:
        raise AssertionError('targetcli left %s behind\n%s%s'
                             % (left, out.stdout, out.stderr))


def _lio_has(export):
    return (os.path.exists(LIO_ROOT + '/iscsi/' + export.target_iqn)
            or any(os.path.basename(p) == export.backstore
                   for p in lio_storage_objects()))


def export_iscsi_rtslib(device, name, initiator_iqn=None, node='a'):
    """Like :func:`export_iscsi`, with rtslib-fb as cinder-rtstool does.

    Call it IN the node's process (``node_a.call(export_iscsi_rtslib, ...)``):
    the portal binds in the network namespace of the caller.
    """
    import rtslib_fb

    topo = topology()
    owner = topo.node(node)
    initiator_iqn = initiator_iqn or topo.b.initiator_iqn
    iqn = target_iqn(owner, name)
    so = rtslib_fb.BlockStorageObject(name, dev=device)
    target = rtslib_fb.Target(rtslib_fb.FabricModule('iscsi'), iqn, 'create')
    tpg = rtslib_fb.TPG(target, 1, mode='create')
    tpg.set_attribute('authentication', '0')
    lun = rtslib_fb.LUN(tpg, 0, so)
    acl = rtslib_fb.NodeACL(tpg, initiator_iqn, mode='create')
    rtslib_fb.MappedLUN(acl, lun.lun, lun)
    rtslib_fb.NetworkPortal(tpg, owner.ip, topo.iscsi_port, mode='create')
    tpg.enable = True
    return IscsiExport(iqn, owner.portal, lun.lun, name, device,
                       initiator_iqn)


def unexport_iscsi_rtslib(export):
    """Delete an export's target and storage object with rtslib-fb."""
    import rtslib_fb

    root = rtslib_fb.RTSRoot()
    for target in root.targets:
        if target.wwn == export.target_iqn:
            target.delete()
    for so in root.storage_objects:
        if so.name == export.backstore:
            so.delete()


def lio_targets():
    return sorted(os.path.basename(p)
                  for p in glob.glob(LIO_ROOT + '/iscsi/iqn.*'))


def lio_storage_objects():
    """Storage objects of every backstore (paths under core/<hba>/)."""
    objs = []
    for hba in glob.glob(LIO_ROOT + '/core/*_*'):
        objs += [p for p in glob.glob(hba + '/*') if os.path.isdir(p)]
    return sorted(objs)


def iscsi_sessions():
    """{session name: target IQN} of the node B initiator's sessions."""
    sessions = {}
    for s in glob.glob('/sys/class/iscsi_session/session*'):
        try:
            with open(s + '/targetname') as f:
                sessions[os.path.basename(s)] = f.read().strip()
        except OSError:
            continue
    return sessions


def iscsi_node_records():
    """Target IQNs with a node record in open-iscsi's database."""
    return sorted(os.path.basename(p) for p in glob.glob('/etc/iscsi/nodes/*'))


def iscsi_connector():
    """An os-brick ISCSIConnector for node B, usable as root in-process.

    os-brick runs its privileged helpers through oslo.privsep, which would
    start a daemon with sudo; the tests run as root, so they run in this
    process instead.  oslo.concurrency needs a lock path for os-brick's
    external locks.
    """
    import os_brick
    from os_brick.initiator import connector
    from os_brick import privileged
    from oslo_concurrency import lockutils
    from oslo_config import cfg

    lock_path = '/run/testbed/locks'
    os.makedirs(lock_path, exist_ok=True)
    lockutils.set_defaults(lock_path)
    os_brick.setup(cfg.CONF)
    privileged.default.set_client_mode(False)
    return connector.InitiatorConnector.factory(
        'ISCSI', root_helper='sudo', use_multipath=False,
        device_scan_attempts=10)


def find_iscsi_disk(target_iqn, lun=0):
    """/dev/sdX of ``lun`` of the session to ``target_iqn``, or None."""
    for s, iqn in iscsi_sessions().items():
        if iqn != target_iqn:
            continue
        disks = '/sys/class/iscsi_session/%s/device/target*/*:*:*:%d/block/*'
        for blk in glob.glob(disks % (s, lun)):
            dev = '/dev/' + os.path.basename(blk)
            if os.path.exists(dev):
                return dev
    return None


def iscsi_login(export, timeout=120):
    """Log node B in to ``export``; return the SCSI disk's /dev path."""
    base = ['iscsiadm', '-m', 'node', '-T', export.target_iqn,
            '-p', export.portal]
    run(base + ['-o', 'new'])
    run(base + ['--login'])

    def diagnostics():
        return '\n'.join(['sessions: %s' % iscsi_sessions()]
                         + kernel_log(20))
    return wait_until(lambda: find_iscsi_disk(export.target_iqn, export.lun),
                      timeout, 'SCSI disk of %s' % export.target_iqn,
                      diagnostics=diagnostics)


def iscsi_logout(export, timeout=120, missing_ok=True):
    """Log node B out of ``export`` and forget its node record."""
    base = ['iscsiadm', '-m', 'node', '-T', export.target_iqn,
            '-p', export.portal]
    logged_in = export.target_iqn in iscsi_sessions().values()
    if logged_in or not missing_ok:
        run(base + ['--logout'])
    if not missing_ok or any(export.target_iqn in p
                             for p in iscsi_node_records()):
        run(base + ['-o', 'delete'])
    wait_until(lambda: export.target_iqn not in iscsi_sessions().values(),
               timeout, 'session to %s gone' % export.target_iqn)


# --------------------------------------------------------------------------
# Leak check
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Per kernel (a node key: see :attr:`Topology.kernels`): LVs, loops."""
    lvs: dict
    loops: dict


def loop_devices():
    out = run(['losetup', '--noheadings', '-O', 'NAME', '-l']).stdout
    return frozenset(line.strip() for line in out.splitlines()
                     if line.strip())


def _on_kernel(node, action, *args):
    """Run this module's ``action`` in ``node``'s kernel; its JSON result.

    In the one-kernel layout (or for the caller's own node) it is a plain
    call; otherwise a short Python process on that node.
    """
    if not topology().separate or node == local_node():
        return _ACTIONS[action](*args)
    proc = run([topology().python, '-m', 'tests.harness.testbed', action,
                json.dumps(args)], node=node, timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _state():
    return sorted(list_lvs()), sorted(loop_devices())


def snapshot(kernels=None):
    """What a test may add and must remove: LVs and loop devices.

    On ``kernels`` (node keys), by default :attr:`Topology.kernels`;
    :func:`leaks` and :func:`force_cleanup` look at the same ones.
    """
    lvs, loops = {}, {}
    for node in kernels or topology().kernels:
        node_lvs, node_loops = _on_kernel(node, 'state')
        lvs[node], loops[node] = frozenset(node_lvs), frozenset(node_loops)
    return Snapshot(lvs=lvs, loops=loops)


def leaks(baseline):
    """Everything left behind compared to ``baseline``; [] when clean.

    On every kernel, absolute checks: no device-mapper device but LVM's
    own (UUID LVM-*), no LIO target or storage object, no iSCSI session or
    node record.  Relative checks: no LV or loop device that was not in
    ``baseline``.
    """
    problems = []
    for node in sorted(baseline.lvs):
        found = _on_kernel(node, 'leaks', sorted(baseline.lvs[node]),
                           sorted(baseline.loops[node]))
        if topology().separate:
            found = ['node %s: %s' % (node.upper(), p) for p in found]
        problems += found
    return problems


def force_cleanup(baseline):
    """Best effort, on every kernel: remove whatever :func:`leaks` reports."""
    for node in sorted(baseline.lvs):
        _on_kernel(node, 'cleanup', sorted(baseline.lvs[node]),
                   sorted(baseline.loops[node]))


def saved_lio_targets():
    """Target IQNs in LIO's saved configurations (restored at a boot)."""
    iqns = set()
    for path in ('/etc/target/saveconfig.json',
                 '/etc/rtslib-fb-target/saveconfig.json'):
        try:
            with open(path) as f:
                saved = json.load(f)
        except FileNotFoundError:
            continue
        iqns.update(t.get('wwn', '?') for t in saved.get('targets', []))
    return sorted(iqns)


def _kernel_leaks(base_lvs, base_loops):
    problems = []
    if topology().separate and saved_lio_targets():
        # what a power cycle of the node would bring back
        problems.append('saved LIO targets: %s' % saved_lio_targets())
    foreign = {n: u for n, u in dm_devices().items()
               if not u.startswith('LVM-')}
    if foreign:
        problems.append('device-mapper devices: %s' % foreign)
    extra = sorted(set(list_lvs()) - set(base_lvs))
    if extra:
        problems.append('logical volumes: %s' % extra)
    if lio_targets():
        problems.append('LIO iSCSI targets: %s' % lio_targets())
    if lio_storage_objects():
        problems.append('LIO storage objects: %s' % lio_storage_objects())
    if iscsi_sessions():
        problems.append('iSCSI sessions: %s' % iscsi_sessions())
    if iscsi_node_records():
        problems.append('iSCSI node records: %s' % iscsi_node_records())
    extra = sorted(loop_devices() - set(base_loops))
    if extra:
        problems.append('loop devices: %s' % extra)
    return problems


def _remove_foreign_dm_devices():
    for _ in range(5):
        foreign = [n for n, u in dm_devices().items()
                   if not u.startswith('LVM-')]
        if not foreign:
            break
        for name in foreign:
            run(['dmsetup', 'remove', '--force', name], check=False)


def _kernel_cleanup(base_lvs, base_loops):
    _remove_foreign_dm_devices()
    if iscsi_sessions():
        run(['iscsiadm', '-m', 'node', '--logoutall=all'], check=False)
    if iscsi_node_records():
        run(['iscsiadm', '-m', 'node', '-o', 'delete'], check=False)
    if topology().separate and saved_lio_targets():
        for path in ('/etc/target/saveconfig.json',
                     '/etc/rtslib-fb-target/saveconfig.json'):
            run(['rm', '-f', path], check=False)
    if lio_targets() or lio_storage_objects():
        # (one kernel: LIO's configfs is global, node A's view will do)
        run(['targetcli', 'clearconfig', 'confirm=True'],
            node=local_node() if topology().separate else 'a', check=False)
    # A device LIO or a session held open above survived its remove with
    # an error table (--force); now nothing holds it.
    _remove_foreign_dm_devices()
    for lv in sorted(set(list_lvs()) - set(base_lvs)):
        lvm('lvremove', '-q', '-f', lv, check=False)
    for loop in sorted(loop_devices() - set(base_loops)):
        run(['losetup', '-d', loop], check=False)


def local_node():
    """The node this process runs on, as far as :func:`run` goes.

    Separate kernels: the node whose guest this is (its host name).  One
    kernel: 'b' (the test node), even in a process in node A's namespace,
    whose commands for node A still go through its ``exec`` prefix.
    """
    hostname = os.uname().nodename
    if topology().separate and hostname.startswith('node'):
        return hostname[len('node'):]
    return 'b'


_ACTIONS = {'state': _state, 'leaks': _kernel_leaks,
            'cleanup': _kernel_cleanup}


def reboot_a():
    """Node A loses its service and its kernel state, as in a reboot.

    Its service is killed first (by the caller); then what the kernel held
    goes: LIO's targets (configfs; /etc/target/saveconfig.json, which
    cinder-rtstool keeps, stays), the handles, and the LVs' activation.
    """
    targetcli(['clearconfig confirm=True'])
    assert lio_targets() == []
    removed = handles('a')
    for name in removed:
        run(['dmsetup', 'remove', name])
    lvm('vgchange', '-q', '-an', topology().a.vg)
    return removed


def handles(node):
    """Names of the device-mapper devices over ``node``'s VG, not LVM's.

    (The driver's handles and clones; on this kernel.)
    """
    vg = topology().node(node).vg.replace('-', '--')
    return [n for n, u in dm_devices().items()
            if not u.startswith('LVM-') and vg in n]


# --------------------------------------------------------------------------
# Power (--layout separate): the runner on the host kills and boots guests
# --------------------------------------------------------------------------

class PowerError(AssertionError):
    pass


def _power_request(action, node, timeout=120):
    """Ask the runner to ``action`` ('power-off' or 'boot') ``node``."""
    topo = topology()
    if not topo.separate:
        raise PowerError('power control needs --layout separate')
    directory = topo.raw['power_dir']
    base = os.path.join(directory, '%d-%s-%s-%s' % (
        time.time_ns(), os.getpid(), action, node))
    with open(base + '.tmp', 'w') as f:
        f.write('%s %s\n' % (action, node))
    os.rename(base + '.tmp', base + '.request')
    LOG.info('power: %s node %s', action, node.upper())
    wait_until(lambda: os.path.exists(base + '.done'), timeout,
               'the runner to %s node %s' % (action, node))
    with open(base + '.done') as f:
        answer = f.read().strip()
    os.unlink(base + '.done')
    if answer != 'ok':
        raise PowerError('%s node %s: %s' % (action, node, answer))


#: How long a running node may take to run ``true`` before it counts as
#: down.  Generous: under emulation on a slow machine a node busy
#: hydrating took longer than 15 s, was judged down and booted again,
#: which the runner refused.  A powered-off node fails fast anyway (its
#: address is unreachable, or its port refuses the connection).
ANSWER_TIMEOUT = 120


def answers(node):
    """True when ``node``'s guest runs commands (its nodelink is up)."""
    try:
        return run(['true'], node=node, check=False,
                   timeout=ANSWER_TIMEOUT).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def boot_id(node):
    """``node``'s kernel's boot id: it changes with every boot."""
    return run(['cat', '/proc/sys/kernel/random/boot_id'],
               node=node).stdout.strip()


def power_off(node):
    """Hard power-off of ``node``'s guest: nothing synced, all state lost.

    Only the node's disks (its volume groups, its /etc/target) survive.
    Returns when the guest's kernel is gone.
    """
    _power_request('power-off', node)


def boot(node, timeout=600):
    """Boot ``node``'s guest with its disks; return when it runs commands."""
    _power_request('boot', node)
    t0 = time.monotonic()
    wait_until(lambda: answers(node), timeout,
               'node %s booted and answering' % node.upper(), interval=1)
    LOG.info('node %s up again after %.1f s', node.upper(),
             time.monotonic() - t0)


if __name__ == '__main__':
    # python -m tests.harness.testbed ACTION JSON-ARGS: one of _ACTIONS
    # in this node's kernel, its result as JSON on the last line (see
    # _on_kernel).
    import sys
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_ACTIONS[sys.argv[1]](*json.loads(sys.argv[2]))))
