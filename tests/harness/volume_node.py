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

"""A node's volume service in the testbed: the real driver, real kernel.

Each node's driver runs in a :class:`tests.harness.workers.NodeProcess`
worker on that node (node A's inside its network namespace, so LIO binds
its portal there, or in node A's own kernel).  Both share one Cinder
database and one coordination backend, as the services of a real
deployment share theirs (:func:`shared_state`: a SQLite file and file
locks on the one kernel's file system; on separate kernels a database of
the control plane's MariaDB and its etcd).  What Cinder's volume
*manager* would do around the driver (create_export, model update,
initialize_connection; terminate, remove export) is done by
:func:`attach` and :func:`detach` here, so the tests exercise the driver
exactly as the manager calls it.

Only the message bus is not real here: a :class:`SocketRPC` replaces the
volume RPC API under the driver's own PeerClient and carries its two calls
(initialize_connection, terminate_connection, with the volume serialised
as Cinder's RPC would) to the other node's worker (:func:`peer_address`:
a UNIX socket in one kernel, TCP between kernels), which runs them as the
volume manager's RPC endpoints do.  What a step carries is built by the
real PeerClient.  The full stack (RabbitMQ, real services) is exercised
separately.
"""

import dataclasses
import errno
import importlib
import multiprocessing.connection
import os
import shlex
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from tests.harness import services
from tests.harness import testbed

BACKEND = 'dmclone'
#: the nodes of the cluster
NODES = ('a', 'b')
#: the worker's state on its node (each kernel has its own)
RUN_DIR = '/srv/cinder-ft'
DB_PATH = RUN_DIR + '/cinder.sqlite'
LOCK_DIR = RUN_DIR + '/locks'
#: separate kernels: the cluster's database on the control plane's
#: MariaDB, and what it needs of the control plane
FT_DATABASE = 'cinder_ft'
CONTROL_PLANE = ('mariadb', 'etcd')
#: separate kernels: the port of each worker's peer calls, on its node's
#: address; the key that admits a caller (multiprocessing's challenge)
PEER_PORT = 7010
PEER_AUTHKEY = b'cinder-dmclone-testbed-peer'
#: how long a new worker waits for its predecessor's port (on another
#: kernel a killed worker's process ends when nodelink notices)
PEER_BIND_TIMEOUT = 60
#: Seconds a peer caller has for each answer of the key exchange.
PEER_HANDSHAKE_TIMEOUT = 30

_STATE = {}


@dataclasses.dataclass(frozen=True)
class SharedState:
    """What both nodes' services share, as a deployment's services do."""
    database: str             # SQLAlchemy URL of the Cinder database
    coordination: str         # tooz backend URL: the cross-node locks
    #: dmclone_shared_file_locks: file:// locks every node sees
    shared_file_locks: bool


def shared_state(separate):
    """The cluster's database and coordination backend for a layout.

    One kernel: a SQLite file and file locks in RUN_DIR, one file system
    for both nodes (the driver accepts file locks only when stated
    shared).  Separate kernels share nothing but the network: database
    FT_DATABASE on the control plane's MariaDB and its etcd (the
    driver's own check refuses node-local locks).
    """
    if separate:
        return SharedState(database=services.database_url(FT_DATABASE),
                           coordination=services.ETCD_URL,
                           shared_file_locks=False)
    return SharedState(database='sqlite:///' + DB_PATH,
                       coordination='file://' + LOCK_DIR,
                       shared_file_locks=True)


def socket_path(node_key):
    return '%s/peer-%s.sock' % (RUN_DIR, node_key)


def peer_address(topo, node_key):
    """Where node ``node_key``'s worker takes the peer calls.

    One kernel: a UNIX socket in RUN_DIR (both workers see it).  Separate
    kernels: the node's own address and PEER_PORT (the run's switch
    carries its guests only; PEER_AUTHKEY still keeps stray connections
    from unpickling anything).
    """
    if topo.separate:
        return (topo.node(node_key).ip, PEER_PORT)
    return socket_path(node_key)


def service_host(node_key):
    return '%s@%s' % (testbed.topology().node(node_key).name, BACKEND)


def volume_host(node_key):
    return '%s#%s' % (service_host(node_key), BACKEND)


# --------------------------------------------------------------------------
# Process-wide setup (runs in every process that touches Cinder)
# --------------------------------------------------------------------------

def configure_process(node_key):
    """oslo.config, objects, privsep and locks as a volume service has."""
    if _STATE.get('configured'):
        return
    from os_brick import privileged
    from oslo_concurrency import lockutils
    from oslo_config import cfg

    # Import what registers options (some on the command line) first.
    from cinder.common import config  # noqa: F401
    from cinder import coordination  # noqa: F401
    import cinder.db.api  # noqa: F401
    from cinder import objects
    from cinder import privsep as cinder_privsep
    from cinder import service  # noqa: F401

    _STATE['node'] = node_key
    topo = testbed.topology()
    shared = shared_state(topo.separate)
    conf = cfg.CONF
    conf([], project='cinder', default_config_files=[])
    # What a volume service's RPC transport registers (the driver reads
    # rpc_response_timeout when it records a move); no transport here.
    from oslo_messaging import opts as messaging_opts
    for group, opts in messaging_opts.list_opts():
        if group is None:
            conf.register_opts(opts)
    objects.register_all()
    os.makedirs(LOCK_DIR, exist_ok=True)
    conf.set_override('connection', shared.database, group='database')
    conf.set_override('backend_url', shared.coordination,
                      group='coordination')
    conf.set_override('lock_path', LOCK_DIR, group='oslo_concurrency')
    conf.set_override('host', topo.node(node_key).name)
    conf.set_override('service_down_time', 24 * 3600)
    conf.set_override('state_path', RUN_DIR)
    lockutils.set_defaults(LOCK_DIR)
    if os.environ.get('DMCLONE_DEMO'):
        # The demo's audience wants the narrative, not the libraries' logs
        # (os-brick logs its expected discovery probe failure as an error).
        import logging
        import warnings
        warnings.simplefilter('ignore')
        logging.getLogger().setLevel(logging.CRITICAL)
    # Root in the guest: privileged helpers run in this process instead
    # of a privsep daemon started through sudo (os-brick's, and Cinder's
    # own, which its LVM helper uses for lvrename and lvcreate).
    privileged.default.set_client_mode(False)
    cinder_privsep.sys_admin_pctxt.set_client_mode(False)
    if os.environ.get(ROOTWRAP_ENV):
        use_rootwrap(os.environ[ROOTWRAP_ENV])
    venv_bin = os.path.dirname(topo.python)
    if venv_bin not in os.environ.get('PATH', '').split(os.pathsep):
        os.environ['PATH'] = venv_bin + os.pathsep + os.environ['PATH']
    _STATE['configured'] = True


# --------------------------------------------------------------------------
# Root commands through cinder-rootwrap (the fault suite runs in this mode)
# --------------------------------------------------------------------------

#: Path of a rootwrap.conf; when set, every root command of the workers
#: goes through ``sudo cinder-rootwrap`` with it.
ROOTWRAP_ENV = 'DMCLONE_FT_ROOTWRAP'
#: DM_DISABLE_UDEV: the guest has no udev, so dmsetup must create its
#: device nodes itself (a real node runs udev).
SUDO_ENV_KEEP = ('DM_DISABLE_UDEV',)


def install_rootwrap(directory):
    """The workers' rootwrap.conf and filters in ``directory``; its path."""
    return services.install_rootwrap(directory, sudo_env_keep=SUDO_ENV_KEEP)


def use_rootwrap(rootwrap_conf):
    """Run every ``run_as_root`` command through cinder-rootwrap.

    oslo's processutils drops the root helper when the caller is root, as
    the workers are in the guest.  This puts it back: the command line
    becomes ``sudo cinder-rootwrap <conf> <cmd>`` exactly as on a compute
    node where cinder-volume runs unprivileged, so a command the filter
    files do not admit fails here too (rootwrap exits 99).  Each command
    and its verdict is logged to the node's :func:`root_command_log` for
    the suite to check.  A node without ``rootwrap_conf`` (another kernel,
    booted since) gets it installed first, as a real node has it on disk.
    """
    from cinder import utils
    from oslo_concurrency import processutils
    from oslo_config import cfg

    if not os.path.exists(rootwrap_conf):
        install_rootwrap(os.path.dirname(rootwrap_conf))
    cfg.CONF.set_override('rootwrap_config', rootwrap_conf)
    helper = utils.get_root_helper()
    original = processutils.execute

    def execute(*cmd, **kwargs):
        if not kwargs.get('run_as_root'):
            return original(*cmd, **kwargs)
        kwargs = dict(kwargs, run_as_root=False)
        kwargs.pop('root_helper', None)
        full = shlex.split(helper) + [str(c) for c in cmd]
        try:
            result = original(*full, **kwargs)
        except processutils.ProcessExecutionError as exc:
            verdict = ('REFUSED' if exc.exit_code == 99
                       or 'Unauthorized command' in (exc.stderr or '')
                       else 'failed')
            _log_root_command(verdict, cmd)
            raise
        _log_root_command('ok', cmd)
        return result
    processutils.execute = execute


def root_command_log(node_key):
    """The log of the root commands of node ``node_key``'s workers.

    On that node: one line per command, "ok", "failed" or "REFUSED" (by
    rootwrap) and the command.
    """
    return '%s/rootwrap-commands-%s.log' % (RUN_DIR, node_key)


def _log_root_command(verdict, cmd):
    with open(root_command_log(_STATE['node']), 'a') as f:
        f.write('%s %s\n' % (verdict, shlex.join(str(c) for c in cmd)))


def _root_command_lines(node_key):
    return testbed.read_text(root_command_log(node_key),
                             node_key).splitlines()


def root_command_marks():
    """{node: lines} of the root command logs so far (see root_commands)."""
    return {key: len(_root_command_lines(key)) for key in NODES}


def root_commands(since=None):
    """"<verdict> <command>" lines of both nodes' logs, A's then B's.

    ``since``: what :func:`root_command_marks` returned; only the lines
    written after it.
    """
    lines = []
    for key in NODES:
        lines += _root_command_lines(key)[(since or {}).get(key, 0):]
    return lines


def clear_root_commands():
    for key in NODES:
        testbed.run(['rm', '-f', root_command_log(key)], node=key)


# --------------------------------------------------------------------------
# Fault injection: kill -9 of this worker at a step of a transfer
# --------------------------------------------------------------------------

def _state_is(state):
    return lambda self, ctxt, t, expected, new_state: new_state == state


def _during(state):
    return lambda self, t, *args: t.state == state


def _op_is(op):
    return lambda self, ctxt, volume, connector, force=False: (
        connector.get('dmclone', {}).get('op') == op)


def _clearing(state):
    """Store.clear of a move in ``state``."""
    return lambda self, ctxt, volume_id, t=None: (
        t is not None and t.state == state)


def _to_node(key):
    """Store.move_volume pointing the record at node ``key``."""
    return lambda self, ctxt, volume_id, host, *args, **kwargs: (
        host.startswith(service_host(key)))


def _old_copy(volume_size, volume_path, *args, **kwargs):
    """volume_utils.clear_volume of an LV the wiper renamed."""
    return '-dmcwipe-' in volume_path


_C = 'cinder_dmclone.clone'
_D = 'cinder_dmclone.destination'
_S = 'cinder_dmclone.move'
_N = 'tests.harness.volume_node'
_V = 'cinder.volume.volume_utils'


def _teardown(phase, state):
    """Clones.tear_down's steps as the crash points of ``phase``.

    A rollback, an abort and a delete each tear down a move in its own
    ``state``: the handle, the session, the data LV, the metadata LV.
    """
    during = _during(state)
    return {
        phase + ': handle removed': (
            _C, 'Clones', 'disconnect_source', 'before', during),
        phase + ': source logged out': (
            _C, 'Clones', 'disconnect_source', 'after', during),
        phase + ': data LV handed to the wiper': (
            _C, 'Clones', 'remove_metadata', 'before', during),
        phase + ': metadata LV removed': (
            _C, 'Clones', 'remove_metadata', 'after', during),
    }


#: name -> (module, class, method, before/after, which call); class None:
#: a function of the module.  The phase (the name's first word) says in
#: which flow the test arms it, on which node:
#:
#: * prepare, commit, finalize: a move, on the destination (node B);
#: * rollback: a failed live migration rolled back (a detach on B while
#:   node A's attachment stays);
#: * held: the same detach when the clone took writes (Destination.hold);
#: * abort: B removing what it built after the source gave the move up;
#:   armed once the clone is built (see arm_withdrawn_attach), since the
#:   clean-up before a build runs the same steps;
#: * delete: a delete of a volume hydrating on B;
#: * wipe: the source's wiper (node A) clearing its retired copy, in the
#:   background (volume_clear must be set on that node).
#:
#: In a teardown (Clones.tear_down: handle, session, data LV, metadata LV)
#: "handle removed" is the moment before the logout and "data LV handed
#: to the wiper" the one before the metadata LV goes: nothing runs in
#: between, and the wiper's entry point is bound at start, out of reach.
CRASH_POINTS = {
    'prepare: LVs created': (_C, 'Clones', 'create_volumes',
                             'after', None),
    'prepare: source logged in': (_C, 'Clones', 'connect_source',
                                  'after', None),
    'prepare: clone built': (_C, 'Clones', 'build_clone', 'after',
                             None),
    # (The source records 'cloned' once this answer reaches it: the last
    # step of the destination's prepare is its check before answering.)
    'prepare: before answering': (_D, 'Destination', '_refuse_if_given_up',
                                  'after', None),
    'commit: hydration enabled': (_C, 'Clones', 'enable_hydration',
                                  'after', None),
    'commit: hydrating recorded': (_S, 'Store', 'transition', 'after',
                                   _state_is('hydrating')),
    'finalize: finalizing recorded': (_S, 'Store', 'transition', 'after',
                                      _state_is('finalizing')),
    'finalize: swapped to linear': (_C, 'Clones', 'swap_to_linear', 'after',
                                    None),
    'finalize: metadata LV removed': (_C, 'Clones',
                                      'remove_metadata', 'after',
                                      _during('finalizing')),
    'finalize: source logged out': (_C, 'Clones',
                                    'disconnect_source', 'after',
                                    _during('finalizing')),
    'finalize: source retired': (_N, 'SocketRPC', 'terminate_connection',
                                 'after', _op_is('retire')),
    'finalize: before the state is cleared': (_S, 'Store', 'clear',
                                              'before', None),
    **_teardown('rollback', 'cloned'),
    'rollback: record back on the source': (_S, 'Store', 'move_volume',
                                            'after', _to_node('a')),
    'rollback: source released': (_N, 'SocketRPC', 'terminate_connection',
                                  'after', _op_is('release')),
    'rollback: state cleared': (_S, 'Store', 'clear', 'after',
                                _clearing('cloned')),
    'held: writes seen': (_C, 'Clones', 'written', 'after',
                          _during('cloned')),
    'held: kept for the stale source attachment': (
        _S, 'Store', 'mark_stale_source_attachment', 'after', None),
    **_teardown('abort', 'preparing'),
    **_teardown('delete', 'hydrating'),
    'delete: source retired': (_N, 'SocketRPC', 'terminate_connection',
                               'after', _op_is('retire')),
    'delete: state cleared': (_S, 'Store', 'clear', 'after',
                              _clearing('hydrating')),
    'wipe: old copy renamed': (_V, None, 'clear_volume', 'before',
                               _old_copy),
    'wipe: old copy wiped': (_V, None, 'clear_volume', 'after', _old_copy),
}


def crash_points(phase):
    """The names of CRASH_POINTS in ``phase``, in their order."""
    return [name for name in CRASH_POINTS
            if name.split(':')[0] == phase]


def arm_crash(point):
    """Make this worker SIGKILL itself at ``point`` (see CRASH_POINTS).

    Whichever thread makes the call (a request, the peer socket's, the
    wiper's) kills the whole worker, as kill -9 of the service would.
    """
    module, cls, attr, when, match = CRASH_POINTS[point]
    klass = importlib.import_module(module)
    if cls is not None:
        klass = getattr(klass, cls)
    original = getattr(klass, attr)

    def die():
        sys.stderr.write('fault injection: kill -9 %s %s\n'
                         % (when, point))
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def crashing(*args, **kwargs):
        if match is not None and not match(*args, **kwargs):
            return original(*args, **kwargs)
        if when == 'before':
            die()
        original(*args, **kwargs)
        die()
    setattr(klass, attr, crashing)


def _withdraw_attach(volume_id):
    """Nova deletes the attachment it reserved (its attach call timed out)."""
    from cinder import context
    from cinder import objects

    from cinder_dmclone import attachments
    ctxt = context.get_admin_context()
    withdrawn = []
    for attachment in objects.VolumeAttachmentList.get_all_by_volume_id(
            ctxt, volume_id):
        if attachment.instance_uuid and \
                attachment.attach_status in attachments.STARTING:
            attachment.destroy()
            withdrawn.append(attachment.id)
    return withdrawn


def arm_withdrawn_attach(point):
    """Nova withdraws the attach this node builds a clone for; then crash.

    Once this worker has built the clone (and only the first time), the
    instance attachment being set up is deleted, as Nova deletes one
    whose attach timed out: the source then refuses to record the move
    (Source._refuse_if_attach_withdrawn), gives it up and asks this node
    to abort.  ``point`` (an ``abort:`` crash point) is armed only then:
    the clean-up that precedes every build runs the same steps.
    """
    from cinder_dmclone import clone
    original = clone.Clones.build_clone

    def build_then_withdraw(self, t, *args, **kwargs):
        path = original(self, t, *args, **kwargs)
        clone.Clones.build_clone = original
        withdrawn = _withdraw_attach(t.volume_id)
        sys.stderr.write('fault injection: attachments %s of volume %s '
                         'withdrawn after the build\n'
                         % (withdrawn, t.volume_id))
        sys.stderr.flush()
        arm_crash(point)
        return path
    clone.Clones.build_clone = build_then_withdraw


def create_database():
    """Cinder's schema in a fresh shared database (:func:`shared_state`).

    One kernel: a new SQLite file.  Separate kernels: the empty database
    the control plane made (:meth:`services.Stack.create_database`).
    Cinder's own migrations either way, as ``cinder-manage db sync``
    runs them.
    """
    from cinder.db import migration
    os.makedirs(RUN_DIR, exist_ok=True)
    if not testbed.topology().separate and os.path.exists(DB_PATH):
        os.unlink(DB_PATH)
    configure_process('b')
    migration.db_sync()


def register_services():
    """Service rows of both nodes' volume services (up, enabled)."""
    from cinder import context
    from cinder import objects
    ctxt = context.get_admin_context()
    for key in ('a', 'b'):
        objects.Service(ctxt, host=service_host(key),
                        binary='cinder-volume', topic='cinder-volume',
                        availability_zone='nova', report_count=1,
                        disabled=False).create()


# --------------------------------------------------------------------------
# The driver of this node
# --------------------------------------------------------------------------

def start_driver(node_key, overrides=None):
    """Build this node's driver, start it as Cinder does; serve its peer.

    Runs in the node's worker.  :func:`init_host` is the volume manager's
    startup: the driver's setup and check (transfer recovery included),
    then ``ensure_export`` of the node's in-use volumes.  Returns what a
    test needs to know of the start, ``ensure_export`` outcomes included.
    """
    configure_process(node_key)     # registers Cinder's objects first
    from cinder import context
    from cinder import coordination
    from cinder.volume import configuration as conf
    from cinder.volume import driver as volume_driver
    from cinder.volume.drivers import lvm

    from cinder_dmclone import driver
    from cinder_dmclone import opts
    from cinder_dmclone import peer

    topo = testbed.topology()
    node = topo.node(node_key)
    coordination.COORDINATOR.start()
    configuration = conf.Configuration(opts.dmclone_opts,
                                       config_group=BACKEND)
    configuration.append_config_values(lvm.volume_opts)
    configuration.append_config_values(volume_driver.volume_opts)
    values = dict(volume_group=node.vg, lvm_type='default',
                  lvm_conf_file=topo.lvm_conf, target_helper='lioadm',
                  target_protocol='iscsi', target_ip_address=node.ip,
                  target_port=topo.iscsi_port,
                  volume_backend_name=BACKEND, volume_clear='none',
                  dmclone_region_size=64, dmclone_monitor_interval=3600,
                  # The full stack's bound in the testbed (a first login
                  # under emulation can take a minute).
                  dmclone_transfer_timeout=240,
                  dmclone_metadata_volume_group=node.meta_vg,
                  # One kernel: both workers' file locks are in one
                  # directory of one file system (LOCK_DIR), so they hold
                  # across the nodes.
                  dmclone_shared_file_locks=shared_state(
                      topo.separate).shared_file_locks)
    if node.target_iqn_prefix:
        values['target_prefix'] = node.target_iqn_prefix.rstrip(':') + ':'
    values.update(overrides or {})
    from oslo_config import cfg
    for key, value in values.items():
        cfg.CONF.set_override(key, value, group=BACKEND)
    drv = driver.DMCloneVolumeDriver(configuration=configuration,
                                     host=service_host(node_key))
    # Only the transport is replaced: the driver's own PeerClient sends.
    drv.peer = peer.PeerClient(
        rpcapi=SocketRPC(node_key,
                         timeout=configuration.dmclone_transfer_timeout),
        node_name=drv.node_name)
    exports = init_host(drv, context.get_admin_context())
    # The looping call needs the service's eventlet hub; tests drive the
    # monitor with tick() instead.
    drv.monitor.stop()
    _STATE['driver'] = drv
    _serve_peer(node_key)
    from cinder.brick.local_dev import lvm as brick_lvm
    return {'host': drv.host, 'node_name': drv.node_name,
            'metadata_vg': drv.metadata_vg.vg_name,
            'lvm_cmd_prefix': list(brick_lvm.LVM.LVM_CMD_PREFIX),
            'ensure_export': exports}


# --------------------------------------------------------------------------
# What Cinder's volume manager does at start (VolumeManager._init_host)
# --------------------------------------------------------------------------

def init_host(drv, ctxt):
    """The driver's part of cinder 29's ``VolumeManager._init_host``.

    In the manager's order: ``do_setup``, ``check_for_setup_error``,
    ``init_capabilities``; the host's volumes and snapshots, their
    ``update_provider_info``; ``ensure_export`` of every volume with a host
    whose status is ``in-use`` (:func:`reexport`); ``set_throttle``,
    ``set_initialized``.  Unlike the manager, a failed setup raises instead
    of leaving the service up with an uninitialized driver, so a test sees
    why.  Left out as they do not reach the driver: capacity accounting,
    encryption key migration, publishing capabilities (RPC) and the
    cleanup of interrupted operations (workers table).

    Returns {volume id: 'ok' | 'error: <reason>'} of the ensure_export
    calls.
    """
    from cinder import objects
    drv.do_setup(ctxt)
    drv.check_for_setup_error()
    drv.init_capabilities()
    # (The manager filters on its cluster when it has one; ours have none.)
    volumes = objects.VolumeList.get_all(ctxt, filters={'host': drv.host})
    snapshots = objects.SnapshotList.get_all(ctxt,
                                             filters={'host': drv.host})
    sync_provider_info(drv, ctxt, volumes, snapshots)
    outcomes = {}
    for volume in volumes:
        if volume.host:
            outcome = reexport(drv, ctxt, volume)
            if outcome is not None:
                outcomes[volume.id] = outcome
    drv.set_throttle()
    drv.set_initialized()
    return outcomes


def sync_provider_info(drv, ctxt, volumes, snapshots):
    """VolumeManager._sync_provider_info: the driver's provider_id updates.

    The manager writes a volume's update whenever the driver returns one,
    a snapshot's only when it has no provider_id yet.
    """
    from cinder.db import api as db
    updates, snapshot_updates = drv.update_provider_info(volumes, snapshots)
    ids = {v.id for v in volumes}
    for update in updates or ():
        if update['id'] in ids:
            db.volume_update(ctxt, update['id'],
                             {'provider_id': update['provider_id']})
    unset = {s.id for s in snapshots if not s.get('provider_id')}
    for update in snapshot_updates or ():
        if update['id'] in unset:
            db.snapshot_update(ctxt, update['id'],
                               {'provider_id': update['provider_id']})


def reexport(drv, ctxt, volume):
    """The manager's start step for one volume: re-export if in use.

    Only ``in-use`` volumes are re-exported; a failure is logged and the
    volume goes from ``in-use`` to ``error`` (a conditional update), and
    the start goes on.  Returns None when the volume was not in use.
    """
    if volume.status != 'in-use':
        return None
    try:
        drv.ensure_export(ctxt, volume)
    except Exception as exc:
        traceback.print_exc()
        sys.stderr.write('init_host: ensure_export of %s failed; volume set '
                         'to error as Cinder does\n' % volume.id)
        volume.conditional_update({'status': 'error'}, {'status': 'in-use'})
        return 'error: %s' % exc
    return 'ok'


def stop_driver():
    from cinder import coordination
    listener = _STATE.pop('listener', None)
    if listener is not None:
        try:
            listener.close()
        except FileNotFoundError:
            # The socket file is already gone (e.g. /srv cleaned up):
            # nothing left to unlink.
            pass
    coordination.COORDINATOR.stop()
    _STATE.pop('driver', None)


def driver():
    return _STATE['driver']


def tick():
    """One hydration monitor pass; returns what it saw and did."""
    report = driver().monitor.tick()
    return {'seen': report.seen, 'handled': report.handled,
            'failed': report.failed}


def pool_capabilities():
    """This node's pool stats, as the scheduler hands them to a migrate."""
    return driver().get_volume_stats(refresh=True)['pools'][0]


def call(method, volume_id, *args, **kwargs):
    """Call a driver method with the volume object loaded from the DB."""
    from cinder import context
    from cinder import objects
    volume = objects.Volume.get_by_id(context.get_admin_context(),
                                      volume_id)
    return getattr(driver(), method)(volume, *args, **kwargs)


def call_ctxt(method, volume_id, *args, **kwargs):
    from cinder import context
    from cinder import objects
    ctxt = context.get_admin_context()
    volume = objects.Volume.get_by_id(ctxt, volume_id)
    return getattr(driver(), method)(ctxt, volume, *args, **kwargs)


def snapshot_call(method, snapshot_id, *args):
    from cinder import context
    from cinder import objects
    snap = objects.Snapshot.get_by_id(context.get_admin_context(),
                                      snapshot_id)
    return getattr(driver(), method)(snap, *args)


def create(method, volume_id, source_id=None):
    """The driver's create_volume, create_cloned_volume or ..._from_snapshot.

    ``source_id`` names the source volume or snapshot of the latter two.
    """
    from cinder import context
    from cinder import objects
    ctxt = context.get_admin_context()
    volume = objects.Volume.get_by_id(ctxt, volume_id)
    if method == 'create_volume':
        return driver().create_volume(volume)
    if method == 'create_cloned_volume':
        source = objects.Volume.get_by_id(ctxt, source_id)
    else:
        source = objects.Snapshot.get_by_id(ctxt, source_id)
    return getattr(driver(), method)(volume, source)


def retype(volume_id, type_id):
    """VolumeManager.retype within the backend."""
    from cinder import context
    from cinder import objects
    from cinder.volume import volume_types
    ctxt = context.get_admin_context()
    volume = objects.Volume.get_by_id(ctxt, volume_id)
    new_type = volume_types.get_volume_type(ctxt, type_id)
    return driver().retype(ctxt, volume, new_type, {}, volume.host)


def own_connector():
    """os-brick's connector properties of this node, as Nova sends them."""
    return driver().peer.own_connector()


# --------------------------------------------------------------------------
# What Cinder's volume manager does around the driver
# --------------------------------------------------------------------------

def _save(volume, update):
    volume.update(update)
    volume.save()


def manager_initialize_connection(volume_id, connector, volume=None):
    """VolumeManager.initialize_connection (tests.harness.manager_flow)."""
    from cinder import context
    from cinder import objects

    from tests.harness import manager_flow
    ctxt = context.get_admin_context()
    if volume is None:
        volume = objects.Volume.get_by_id(ctxt, volume_id)
    return manager_flow.initialize_connection(driver(), ctxt, volume,
                                              connector, _save)


def attach(volume_id, attachment_id, connector):
    """VolumeManager.attachment_update: returns the connection info."""
    import json

    from cinder import context
    from cinder.db import api as db
    ctxt = context.get_admin_context()
    info = manager_initialize_connection(volume_id, connector)
    db.volume_attachment_update(ctxt, attachment_id,
                                {'attach_status': 'attaching',
                                 'connector': json.dumps(connector)})
    db.volume_attached(ctxt, attachment_id, None, connector['host'],
                       'na', 'rw', False)
    return info


def detach(volume_id, attachment_id):
    """VolumeManager.attachment_delete."""
    from cinder import context
    from cinder.db import api as db
    from cinder import objects
    from tests.harness import manager_flow
    ctxt = context.get_admin_context()
    volume = objects.Volume.get_by_id(ctxt, volume_id)
    attachment = objects.VolumeAttachment.get_by_id(ctxt, attachment_id)
    shared = manager_flow.terminate_connection(driver(), ctxt, volume,
                                               attachment.connector)
    db.volume_detached(ctxt, volume_id, attachment_id)
    return shared


# --------------------------------------------------------------------------
# The message bus stand-in
# --------------------------------------------------------------------------

class SocketRPC(object):
    """The volume RPC API's two calls, to the other node's worker.

    Like an RPC call, a call gives up after ``timeout`` seconds with
    oslo.messaging's MessagingTimeout, while the other node may still be
    running the step.  The timeout bounds the whole call, the connection
    and its key exchange included: a peer whose every worker is busy (or
    whose service hangs) does not hold the caller longer.
    """

    def __init__(self, node_key, timeout=None):
        self.node_key = node_key
        self.timeout = timeout

    def _send(self, method, routed, connector):
        from cinder.objects import base
        target = 'b' if routed.host.startswith(service_host('b')) else 'a'
        serializer = base.CinderObjectSerializer()
        deadline = time.monotonic() + self.timeout if self.timeout else None
        conn = _connect(peer_address(testbed.topology(), target), deadline,
                        '%s to node %s' % (method, target))
        try:
            conn.send((method, serializer.serialize_entity(None, routed),
                       connector))
            if deadline is not None and not conn.poll(
                    max(0.0, deadline - time.monotonic())):
                raise _timeout('no answer from node %s to %s within %d s'
                               % (target, method, self.timeout))
            ok, value = conn.recv()
        finally:
            conn.close()
        if not ok:
            raise value
        return value

    def initialize_connection(self, ctxt, volume, connector):
        return self._send('initialize_connection', volume, connector)

    def terminate_connection(self, ctxt, volume, connector, force=False):
        return self._send('terminate_connection', volume, connector)


def _timeout(message):
    import oslo_messaging
    return oslo_messaging.MessagingTimeout(message)


def _connect(address, deadline, what):
    """A connection to a peer endpoint, its key exchange done by ``deadline``.

    ``multiprocessing.connection.Client`` has no timeout of its own (the
    exchange waits for the peer to accept): it runs in a thread of its
    own, and a connection made after the deadline is closed there.
    None: no deadline.
    """
    def connect():
        return multiprocessing.connection.Client(address,
                                                 authkey=PEER_AUTHKEY)

    if deadline is None:
        return connect()
    lock = threading.Lock()
    box = {}

    def run():
        try:
            conn = connect()
        except Exception as exc:
            conn, box['error'] = None, exc
        with lock:
            if box.get('late'):
                if conn is not None:
                    conn.close()
                return
            box['conn'] = conn

    thread = threading.Thread(target=run, daemon=True,
                              name='peer-connect')
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    with lock:
        if 'conn' not in box:
            box['late'] = True
            raise _timeout('no connection for %s within its timeout' % what)
    if box['conn'] is None:
        raise box['error']
    return box['conn']


def _handle(method, primitive, connector):
    """Run one peer request as the volume manager's endpoint would."""
    from cinder import context
    from cinder import objects
    from cinder.objects import base
    ctxt = context.get_admin_context()
    volume = base.CinderObjectSerializer().deserialize_entity(ctxt,
                                                              primitive)
    if method == 'initialize_connection':
        # The routed copy travels (its host names this node).
        return manager_initialize_connection(volume.id, connector, volume)
    volume = objects.Volume.get_by_id(ctxt, volume.id)
    return driver().terminate_connection(volume, connector, force=False)


def _authenticate(conn):
    """The key exchange of a peer connection, bounded in time.

    Done here, not by the listener's accept (which has no timeout): a
    caller that connects and never answers (its node frozen or powered
    off mid-call) then holds only its own thread.
    """
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        sock.settimeout(None)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack('ll', PEER_HANDSHAKE_TIMEOUT, 0))
        multiprocessing.connection.deliver_challenge(conn, PEER_AUTHKEY)
        multiprocessing.connection.answer_challenge(conn, PEER_AUTHKEY)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack('ll', 0, 0))
    finally:
        sock.close()


def _serve_one(conn):
    """Answer the one request of a peer connection, then close it."""
    try:
        _authenticate(conn)
    except (multiprocessing.AuthenticationError, OSError, EOFError):
        # A caller without the key, gone or mute during the exchange.
        traceback.print_exc()
        conn.close()
        return
    try:
        method, primitive, connector = conn.recv()
        try:
            answer = (True, _handle(method, primitive, connector))
        except Exception as exc:
            traceback.print_exc()
            answer = (False, exc)
        conn.send(answer)
    except (OSError, EOFError):
        # The caller timed out and hung up: its answer is lost, as an
        # RPC reply after the caller's timeout would be.
        traceback.print_exc()
    finally:
        conn.close()


def _listen(address):
    """A listener on ``address``, once its last holder has let it go.

    (A UNIX socket's file outlives a killed worker; on another kernel a
    killed worker's port is free only once nodelink has ended it.)
    """
    if isinstance(address, str) and os.path.exists(address):
        os.unlink(address)
    deadline = time.monotonic() + PEER_BIND_TIMEOUT
    while True:
        try:
            # (A backlog as a busy RPC server's: a TCP caller beyond it
            # would wait for SYN retries, not in the queue.)
            # (No authkey here: _serve_one makes the exchange, bounded.)
            return multiprocessing.connection.Listener(address, backlog=16)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(1)


def _serve_peer(node_key):
    """Take the peer calls to this node, each in its own thread.

    As a volume service's RPC workers do: a step that blocks (a prepare
    in an iSCSI login during a network cut) does not hold the next one
    (the abort its caller sends once it gave up); the driver's own
    locks order them where it needs.
    """
    listener = _listen(peer_address(testbed.topology(), node_key))
    _STATE['listener'] = listener

    def loop():
        while True:
            try:
                conn = listener.accept()
            except ConnectionError:
                traceback.print_exc()
                continue
            except OSError:
                return      # (closed)
            threading.Thread(target=_serve_one, args=(conn,), daemon=True,
                             name='peer-call').start()

    threading.Thread(target=loop, daemon=True, name='peer').start()
