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

"""The full Cinder stack of the testbed.

MariaDB, RabbitMQ and etcd (Debian's packages), cinder-api with noauth,
cinder-scheduler and one cinder-volume service per node with this driver,
all real processes configured from ``tools/testbed/stack/``.  On separate
kernels each node's volume service runs in its node's guest kernel and the
control plane (the servers, cinder-api, cinder-scheduler) on node "cp",
natively on the host on the run's segment (tools/testbed/control-plane):
none of it needs device-mapper, and under emulation it starved.  On one
kernel, node A's service runs in network namespace ``nodeA`` and the
control plane on node B.  Every process is started through its node's
``exec`` prefix (:attr:`tests.harness.testbed.Topology.control`); the
configuration names the control plane ``controller`` (each node's
/etc/hosts).  :class:`Stack` starts them, waits on real
readiness (a port answering, the services' rows fresh in the database, the
scheduler listing every pool), restarts or kills a volume service for the
fault scenarios and shows the tail of every log when something does not
come up.  Logs go to the run directory, which the host keeps.
"""

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

from tests.harness import testbed
from tests.harness import workers

LOG = logging.getLogger('stack')

#: the control plane's host name on every node (guest/init's /etc/hosts,
#: tools/testbed/control-plane's): its servers listen on all of its
#: addresses, and everything reaches them by this name
CONTROLLER = 'controller'
API = 'http://%s:8776/v3' % CONTROLLER
#: etcd of the control plane, as the volume services' [coordination]
#: backend_url names it (tools/testbed/stack/cinder.conf)
ETCD_URL = 'etcd3+http://%s:2379?api_version=v3&timeout=60' % CONTROLLER
#: the servers of the control plane, in the order they are started
CONTROL_PLANE = ('mariadb', 'rabbitmq', 'etcd')
#: Cinder's services on the control plane's node
CONTROL_SERVICES = ('cinder-api', 'cinder-scheduler')
ETC = '/etc/cinder'
CONF_DIR = '/src/tools/testbed/stack'
STATE = '/var/lib/cinder'
VOLUME_TYPE = 'dmclone'
#: the thick backend's section (cinder.conf), always enabled
BACKEND = 'dmclone'
#: the thin backend's section, enabled by thin.conf (:meth:`Stack.use_thin`)
THIN_BACKEND = 'dmclone-thin'
#: the benchmarks' overrides of both backends, after thin.conf
#: (``Stack.use_thin(True, extra=(BENCH_THIN_CONF,))``, tests/bench)
BENCH_THIN_CONF = 'bench-thin.conf'
#: the thin map on for the thin backend, after thin.conf, for the
#: functional end-to-end proof only (tests/functional/test_thin_map.py)
THIN_MAP_CONF = 'thin-map.conf'
NODE_AZ = {'a': 'az-a', 'b': 'az-b', 'c': 'az-c'}
MICROVERSION = '3.54'


class StackError(AssertionError):
    pass


def install_rootwrap(directory, sudo_env_keep=()):
    """rootwrap.conf and filters as a compute node installs them.

    Cinder's volume.filters and this project's dmclone.filters go to
    ``<directory>/rootwrap.d`` (made the filters_path unless Cinder's
    default already lists it), the venv's bin joins exec_dirs, and sudo
    finds cinder-rootwrap and privsep-helper on the venv's path, keeping
    ``sudo_env_keep``.  Returns the rootwrap.conf path.
    """
    topo = testbed.topology()
    venv = os.path.dirname(os.path.dirname(topo.python))
    filters = os.path.join(directory, 'rootwrap.d')
    os.makedirs(filters, exist_ok=True)
    shutil.copy(os.path.join(venv, 'etc/cinder/rootwrap.d/volume.filters'),
                filters)
    shutil.copy(os.path.join(topo.src, 'etc/cinder/rootwrap.d/'
                             'dmclone.filters'), filters)
    with open(os.path.join(venv, 'etc/cinder/rootwrap.conf')) as f:
        conf = f.read().splitlines()
    for i, line in enumerate(conf):
        key, _sep, value = line.partition('=')
        if key == 'filters_path' and filters not in value.split(','):
            conf[i] = 'filters_path=%s' % filters
        elif key == 'exec_dirs':
            conf[i] = 'exec_dirs=%s,%s' % (os.path.join(venv, 'bin'), value)
    path = os.path.join(directory, 'rootwrap.conf')
    with open(path, 'w') as f:
        f.write('\n'.join(conf) + '\n')
    with open('/etc/sudoers.d/testbed', 'w') as f:
        f.write('Defaults secure_path="%s:/usr/local/sbin:/usr/local/bin:'
                '/usr/sbin:/usr/bin:/sbin:/bin"\n' % os.path.join(venv, 'bin'))
        for name in sudo_env_keep:
            f.write('Defaults env_keep += "%s"\n' % name)
    os.chmod('/etc/sudoers.d/testbed', 0o440)
    return path


def database_url(name):
    """The SQLAlchemy URL of database ``name`` on the control plane."""
    return 'mysql+pymysql://cinder:cinder@%s/%s?charset=utf8' % (CONTROLLER,
                                                                 name)


def install_volume_node(*nodes):
    """The volume services' configuration of ``nodes``: Cinder's, rootwrap.

    cinder.conf, thin.conf, bench-thin.conf and thin-map.conf (which
    only :meth:`Stack.use_thin` passes to the service) and each node's
    node-<key>.conf, rootwrap and the state
    directory.  Runs on the node (separate-kernel layout: node A's own
    guest has none of the files node B's :meth:`Stack.install_configs`
    writes).
    """
    os.makedirs(ETC, exist_ok=True)
    for name in ['cinder.conf', 'thin.conf', BENCH_THIN_CONF,
                 THIN_MAP_CONF] + ['node-%s.conf' % key for key in nodes]:
        shutil.copy(os.path.join(CONF_DIR, name), ETC)
    install_rootwrap(ETC)
    os.makedirs(STATE + '/tmp', exist_ok=True)


def install_control_node(log_dir):
    """The control plane's configuration, on its node.

    The servers' (MariaDB, RabbitMQ), cinder-api's and
    cinder-scheduler's, and the stack's log directory.
    """
    os.makedirs(log_dir, exist_ok=True)
    shutil.copy(os.path.join(CONF_DIR, 'mariadb.cnf'),
                '/etc/mysql/mariadb.conf.d/99-testbed.cnf')
    for name in ('rabbitmq.config', 'rabbitmq-env.conf'):
        shutil.copy(os.path.join(CONF_DIR, name), '/etc/rabbitmq/')
    install_volume_node()
    venv = os.path.dirname(os.path.dirname(testbed.topology().python))
    shutil.copy(os.path.join(CONF_DIR, 'api.conf'), ETC)
    shutil.copy(os.path.join(venv, 'etc/cinder/resource_filters.json'), ETC)
    install_paste(os.path.join(venv, 'etc/cinder/api-paste.ini'))
    os.makedirs(STATE + '/api-locks', exist_ok=True)


def install_paste(source):
    """Cinder's api-paste.ini with the default-token filter in noauth."""
    with open(source) as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        if line.startswith('noauth =') and ' noauth ' in line:
            line = line.replace(' noauth ', ' defaulttoken noauth ')
        out.append(line)
    out += ['', '[filter:defaulttoken]',
            'paste.filter_factory = noauth_token:filter_factory', '']
    with open(ETC + '/api-paste.ini', 'w') as f:
        f.write('\n'.join(out))


def prepare_mariadb():
    """A fresh copy of MariaDB's data directory, on the control node.

    A copy over the last stack's files resets InnoDB's system tables but
    keeps the cinder tables' files ("doesn't exist in engine" at the next
    db sync).
    """
    os.makedirs('/run/mysqld', exist_ok=True)
    shutil.rmtree('/srv/mysql', ignore_errors=True)
    shutil.copytree('/var/lib/mysql', '/srv/mysql', symlinks=True)
    testbed.run(['chown', '-R', 'mysql:mysql', '/run/mysqld', '/srv/mysql'])


def prepare_rabbitmq():
    """RabbitMQ's directories, on the control node."""
    for d in ('/srv/rabbitmq/mnesia', '/srv/rabbitmq/log'):
        os.makedirs(d, exist_ok=True)
    testbed.run(['chown', '-R', 'rabbitmq:rabbitmq', '/srv/rabbitmq',
                 '/var/lib/rabbitmq'])


def prepare_control_node(log_dir, servers=()):
    """The control plane's configuration, and fresh data for ``servers``.

    In one visit of its node (each is a worker started there, seconds
    under emulation on node B's side): :func:`install_control_node`,
    then :func:`prepare_mariadb` and :func:`prepare_rabbitmq` for those
    of them ``servers`` names.
    """
    install_control_node(log_dir)
    if 'mariadb' in servers:
        prepare_mariadb()
    if 'rabbitmq' in servers:
        prepare_rabbitmq()


def _mysql_greets(host, port=3306, timeout=5):
    """True when a MySQL server at ``host`` sends its first packet.

    A server that accepts connections sends its greeting (protocol
    version 10) or an error packet (0xff: a host it refuses, too many
    connections) at once: either way it serves.  A port that accepts
    but says nothing (a server still starting) is not ready.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            head = s.recv(5, socket.MSG_WAITALL)
    except OSError:
        return False
    return len(head) == 5 and head[4] in (0x0a, 0xff)


def _port_open(ip, port):
    try:
        with socket.create_connection((ip, port), timeout=2):
            return True
    except OSError:
        return False


def _http_json(url, timeout=30, headers=None):
    req = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body else None


_ERROR_PREFIX = re.compile(r'^(\S+ \S+ \d+ ERROR \S+)')
_DATED = re.compile(r'^\d{4}-\d\d-\d\d ')


def _error_records(name, lines):
    """Group a log's ERROR lines into records (see Stack.error_records)."""
    records, key, bare = [], None, False
    for line in lines:
        match = _ERROR_PREFIX.match(line)
        if match:
            if match.group(1) != key:
                records.append((name, []))
            key, bare = match.group(1), False
            records[-1][1].append(line)
        elif bare and line and not _DATED.match(line):
            records[-1][1].append(line)
        elif 'Traceback' in line or ' ERROR ' in line:
            records.append((name, [line]))
            key, bare = None, True
        else:
            key, bare = None, False
    return records


def end_group(proc, grace=60):
    """Stop ``proc``'s process group: SIGTERM, SIGKILL what is left.

    Returns once no process of the group is left (or ``grace`` seconds
    after the SIGTERM, when the rest is killed).  Waiting for the leader
    is not enough: ``rabbitmq-server``'s wrapper exits at once while the
    broker shuts down at its pace, holding its ports, and the next
    stack's broker then fails to start while the old one answers.
    """
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
        if _group_left(proc, grace):
            LOG.warning('process group %d outlived its SIGTERM by %d s: '
                        'killing it', pgid, grace)
            os.killpg(pgid, signal.SIGKILL)
            _group_left(proc, 30)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _group_left(proc, timeout):
    """True while ``proc``'s group has a process after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        proc.poll()                   # reap the leader: a zombie is a member
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.2)


class Stack(object):
    """The control plane of the testbed: start, watch, stop."""

    def __init__(self, topo, log_dir=None):
        self.topo = topo
        self.log_dir = log_dir or os.path.join(topo.artifacts_dir, 'stack')
        self.procs = {}
        self.timings = {}
        #: per node: the database's time when its volume service started
        self._volume_started = {}
        #: per node on another kernel: its boot id when its volume
        #: service started (see :meth:`outlived_by`)
        self._volume_boot = {}
        #: the volume services run the thin backend too (use_thin)
        self.thin = False
        #: the files (in /etc/cinder) passed after thin.conf (use_thin)
        self.thin_extra = ()
        #: the node of the control plane's processes (its own, or B)
        self.cp = topo.control.key
        self._t0 = time.monotonic()

    # -- process handling --------------------------------------------------

    def _env(self):
        env = dict(os.environ)
        venv_bin = os.path.dirname(self.topo.python)
        env['PATH'] = os.pathsep.join([venv_bin, env.get('PATH', '')])
        # The project from the tree; the paste filter from the stack dir.
        env['PYTHONPATH'] = os.pathsep.join([self.topo.src, CONF_DIR])
        env['DM_DISABLE_UDEV'] = '1'
        return env

    def _log(self, name):
        return os.path.join(self.log_dir, '%s.log' % name)

    def _spawn(self, name, argv, node, user_env=None):
        if node != testbed.local_node():
            argv = list(self.topo.node(node).exec_prefix) + list(argv)
        out = open(self._log(name + '.out'), 'ab')
        env = self._env()
        env.update(user_env or {})
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True,
                                cwd='/')
        out.close()
        self.procs[name] = proc
        LOG.info('started %s (pid %d): %s', name, proc.pid, ' '.join(argv))
        return proc

    def alive(self, name):
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def outlived_by(self, node):
        """True when ``node`` booted since its volume service started.

        The service of another kernel's node is a local nodelink process
        (see :meth:`_spawn`) that outlives the node's power-off by up to
        nodelink's keepalive bounds (minutes): :meth:`alive` still says
        yes while nothing serves the node's backend.
        """
        started = self._volume_boot.get(node)
        return started is not None and testbed.boot_id(node) != started

    def _stamp(self, what):
        self.timings[what] = round(time.monotonic() - self._t0, 1)
        LOG.info('stack: %s after %.1f s', what, self.timings[what])

    def _wait(self, predicate, timeout, what, procs=()):
        """Wait for ``predicate``; fail early if a named process died."""
        def ready():
            for name in procs:
                if not self.alive(name):
                    raise StackError('%s exited with %s while waiting for '
                                     '%s\n%s' % (name,
                                                 self.procs[name].poll(),
                                                 what, self.diagnostics()))
            return predicate()
        try:
            testbed.wait_until(ready, timeout, what, interval=0.5)
        except testbed.WaitTimeout as exc:
            raise StackError('%s\n%s' % (exc, self.diagnostics()))
        self._stamp(what)

    def diagnostics(self, lines=25):
        """The tail of every log of the stack, for a failure message."""
        parts = []
        for name in sorted(os.listdir(self.log_dir)):
            path = os.path.join(self.log_dir, name)
            try:
                with open(path, 'rb') as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 12000))
                    tail = f.read().decode('utf-8', 'replace')
            except OSError:
                continue
            tail = '\n'.join(tail.splitlines()[-lines:])
            parts.append('---- %s\n%s' % (name, tail))
        return '\n'.join(parts)

    # -- configuration ------------------------------------------------------

    def install_configs(self):
        """Put the volume services' configuration where they look.

        (The control plane's node gets its own as its servers start,
        :meth:`_spawn_control_plane`.)
        """
        os.makedirs(self.log_dir, exist_ok=True)
        # Every node's service configuration: in the one-kernel layout
        # node A's service runs in this guest too.  (privsep starts its
        # helper through sudo, on the venv's path.)
        install_volume_node('a', 'b', 'c')
        if self.topo.separate:
            with workers.NodeProcess('a') as node_a:
                node_a.call(install_volume_node, 'a')

    def _on_control(self, fn, *args):
        """``fn(*args)`` on the control plane's node; its result."""
        if self.cp == testbed.local_node():
            return fn(*args)
        with workers.NodeProcess(self.cp) as node:
            return node.call(fn, *args)

    def _control_run(self, argv, **kwargs):
        """A command on the control plane's node (:func:`testbed.run`)."""
        return testbed.run(argv, node=self.cp, **kwargs)

    # -- infrastructure -------------------------------------------------------

    def _spawn_mariadb(self):
        """MariaDB (over a fresh copy of its data: prepare_mariadb)."""
        self._spawn('mariadb', ['/usr/sbin/mariadbd', '--user=mysql'],
                    self.cp)

    def mariadb_ready(self):
        """The server speaks its protocol on the segment.

        As the services reach it, without a user: theirs exists only
        after :meth:`create_database`, and MariaDB's client fails its
        ``ping`` when the server refuses the host (error 1130, before
        TLS), though the server is up.
        """
        return _mysql_greets(CONTROLLER)

    @staticmethod
    def _mysql_env():
        return dict(os.environ, MYSQL_PWD='cinder')

    def create_database(self, name='cinder', fresh=False):
        """Database ``name`` for the services' user (empty if ``fresh``).

        ``fresh``: dropped first.  The stack's own is ``cinder``; the
        driver cluster of the separate-kernel layout has one of its own on
        the same server (:func:`tests.harness.volume_node.shared_state`).
        """
        sql = ("CREATE DATABASE IF NOT EXISTS {0}; "
               "CREATE USER IF NOT EXISTS 'cinder'@'%' IDENTIFIED BY "
               "'cinder'; GRANT ALL ON {0}.* TO 'cinder'@'%'; "
               "FLUSH PRIVILEGES;").format(name)
        if fresh:
            sql = 'DROP DATABASE IF EXISTS %s; %s' % (name, sql)
        # (as root: through the server's socket, on its node)
        self._control_run(['mysql', '-e', sql])

    def sync_database(self):
        """Cinder's schema in the stack's database (``cinder-manage``)."""
        self._control_run(['cinder-manage', '--config-file',
                           ETC + '/cinder.conf', 'db', 'sync'],
                          timeout=600, env=self._env())

    def start_rabbitmq(self):
        self._on_control(prepare_rabbitmq)
        self._spawn_rabbitmq()

    def _spawn_rabbitmq(self):
        self._spawn('rabbitmq', ['rabbitmq-server'], self.cp,
                    user_env={'HOME': '/var/lib/rabbitmq'})

    def _spawn_etcd(self):
        client_url = 'http://%s:2379' % self.topo.control.ip
        self._spawn('etcd', [
            'etcd', '--name', 'testbed', '--data-dir', '/srv/etcd',
            '--listen-client-urls', client_url,
            '--advertise-client-urls', client_url,
            '--listen-peer-urls', 'http://127.0.0.1:2380',
            '--initial-advertise-peer-urls', 'http://127.0.0.1:2380',
            '--initial-cluster', 'testbed=http://127.0.0.1:2380'],
            self.cp, user_env={'ETCD_UNSUPPORTED_ARCH': 'amd64'})

    def etcd_ready(self):
        try:
            return _http_json('http://%s:2379/health' % CONTROLLER,
                              timeout=5).get('health') == 'true'
        except (OSError, ValueError):
            return False

    def rabbitmq_ready(self):
        return _port_open(CONTROLLER, 5672)

    def start_control_plane(self, parts=CONTROL_PLANE):
        """Start the servers ``parts`` names; return once they all serve.

        Those already running are left as they are: the full stack
        (:meth:`start`) completes a control plane whose database and
        etcd the driver cluster started first, and the cluster uses those
        of a running stack (:func:`tests.harness.pytest_fixtures.
        control_plane`).  MariaDB starts over a fresh copy of its data
        directory: nothing but the first start may spawn it.
        """
        self._spawn_control_plane(parts)
        self._wait_control_plane(parts)

    def _spawn_control_plane(self, parts):
        """Spawn the servers of ``parts`` that do not run.

        Their node is visited once first (:func:`prepare_control_node`):
        its configuration, and fresh data for what starts.
        """
        starting = [name for name in CONTROL_PLANE
                    if name in parts and not self.alive(name)]
        self._on_control(prepare_control_node, self.log_dir, starting)
        for name in starting:
            getattr(self, '_spawn_' + name)()

    def _wait_control_plane(self, parts):
        ready = {'mariadb': (self.mariadb_ready, 300, 'MariaDB answering'),
                 'etcd': (self.etcd_ready, 300, 'etcd healthy'),
                 'rabbitmq': (self.rabbitmq_ready, 900,
                              'RabbitMQ listening')}
        for name in ('mariadb', 'etcd', 'rabbitmq'):
            if name in parts:
                predicate, timeout, what = ready[name]
                self._wait(predicate, timeout, what, procs=[name])

    # -- cinder ---------------------------------------------------------------

    def _cinder(self, binary, node=None, extra=()):
        """Start a Cinder service; ``node``: the control plane's if None."""
        node = node or self.cp
        name = binary if binary != 'cinder-volume' else 'volume-' + node
        argv = [binary, '--config-file', ETC + '/cinder.conf']
        argv += list(extra)
        argv += ['--log-file', self._log(name)]
        return self._spawn(name, argv, node=node)

    def _start_api(self):
        return self._cinder('cinder-api', extra=('--config-file',
                                                 ETC + '/api.conf'))

    def _start_scheduler(self):
        return self._cinder('cinder-scheduler')

    @property
    def backends(self):
        """The backend sections every node's volume service runs."""
        return (BACKEND, THIN_BACKEND) if self.thin else (BACKEND,)

    def volume_hosts(self, node):
        """The service hosts of ``node``'s backends (``node-a@dmclone``)."""
        return ['%s@%s' % (self.topo.node(node).name, backend)
                for backend in self.backends]

    def start_volume(self, node):
        # the database's clock: its rows' updated_at are in it
        self._volume_started[node] = self._db('SELECT UTC_TIMESTAMP()',
                                              check=False) or None
        if node != testbed.local_node():
            self._volume_boot[node] = testbed.boot_id(node)
        extra = ['--config-file', '%s/node-%s.conf' % (ETC, node)]
        if self.thin:
            for name in ('thin.conf',) + self.thin_extra:
                extra += ['--config-file', '%s/%s' % (ETC, name)]
        return self._cinder('cinder-volume', node=node, extra=extra)

    def use_thin(self, on, nodes=('a', 'b'), extra=()):
        """Run the thin backend beside the thick one on ``nodes``, or not.

        Restarts the volume services (with or without thin.conf, the
        others' as they are) and returns once each reports for every
        backend it runs and, with ``on``, the scheduler lists the thin
        pools.  The first start of the thin backend on a node creates
        its pool (Cinder's LVM driver).  A volume service a test starts
        again meanwhile (:func:`keep_running`) starts the same way.
        ``extra``: more files of /etc/cinder passed after thin.conf while
        ``on`` (the benchmarks' :data:`BENCH_THIN_CONF`); a change of
        them alone restarts the services too.
        """
        extra = tuple(extra) if on else ()
        if self.thin == on and self.thin_extra == extra:
            return
        for node in nodes:
            name = 'volume-' + node
            if self.alive(name):
                end_group(self.procs[name])
                LOG.info('%s stopped', name)
        self.thin = on
        self.thin_extra = extra
        for node in nodes:
            self.restart_volume(node)
        if on:
            self._wait(lambda: self.pools_ready(THIN_BACKEND, nodes), 600,
                       'the thin pools listed')

    def kill_volume(self, node, sig=signal.SIGKILL):
        """Kill node's cinder-volume (and its privsep helpers) at once."""
        name = 'volume-' + node
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        proc.wait(timeout=60)
        LOG.info('%s killed with signal %d', name, sig)

    def power_off(self, node):
        """Hard power-off of ``node`` (separate layout), service and all.

        The local end of the node's service (its nodelink caller) would
        only notice at its keepalive's end: it goes at once.
        """
        testbed.power_off(node)
        self.kill_volume(node)

    def boot(self, node):
        """Boot ``node`` again; its volume service starts as at boot."""
        testbed.boot(node)
        self.restart_volume(node)

    def restart_volume(self, node):
        """Start ``node``'s cinder-volume again; return once it reports.

        On another kernel the node's Cinder configuration is installed
        first (a real node has it on disk): the node may have booted since
        it was installed (a power-off, or the driver cluster's reboot of
        it), and a booted guest comes back with its disks only.
        """
        if self.topo.separate and node != testbed.local_node():
            with workers.NodeProcess(node) as worker:
                worker.call(install_volume_node, node)
        self.start_volume(node)
        self.wait_volume_up(node)

    def stop_volumes(self):
        """Stop every node's cinder-volume, as a service manager stops it.

        SIGTERM to its process group (on another kernel, nodelink passes
        it on), SIGKILL for what outlives the grace period.  For the
        driver cluster, whose services use the same volume groups
        (:meth:`tests.harness.driver_cluster.Cluster.ensure_running`);
        :func:`keep_running` starts them again.
        """
        for name in sorted(self.procs):
            if name.startswith('volume-') and self.alive(name):
                end_group(self.procs[name])
                LOG.info('%s stopped', name)

    def _db(self, query, check=True):
        """A query's rows as text.

        A failed query raises unless ``check`` is false (readiness polls,
        which try again): an empty answer must never stand for "no rows"
        when the database did not answer.
        """
        proc = subprocess.run(['mysql', '--host', CONTROLLER, '--user',
                               'cinder', '-N', '-B', 'cinder', '-e', query],
                              capture_output=True, text=True, timeout=60,
                              env=self._mysql_env())
        if proc.returncode != 0:
            if check:
                raise StackError('mysql failed (%d) on %r: %s' % (
                    proc.returncode, query, proc.stderr.strip()))
            LOG.debug('mysql failed: %s', proc.stderr.strip())
        return proc.stdout.strip()

    def services_up(self, hosts, since=None):
        """True when every ``hosts`` row reported within the last 40 s.

        ``since`` (the database's UTC time, as text): only reports made
        after it count, so a service's last report before it was killed
        or powered off does not pass for its restart.
        """
        fresh = "updated_at > UTC_TIMESTAMP() - INTERVAL 40 SECOND"
        if since:
            fresh += " AND updated_at > '%s'" % since
        rows = self._db("SELECT host FROM services WHERE deleted=0 AND "
                        "disabled=0 AND " + fresh, check=False)
        return set(hosts) <= set(rows.split())

    def pools(self):
        try:
            return _http_json(
                API + '/scheduler-stats/get_pools?detail=True',
                headers={'X-Auth-Token': 'admin:admin',
                         'OpenStack-API-Version': 'volume ' + MICROVERSION}
            ).get('pools', [])
        except (OSError, ValueError, urllib.error.URLError):
            return []

    def pools_ready(self, backend=None, nodes=('a', 'b')):
        """True when the scheduler lists a pool of every one of ``nodes``.

        ``backend``: a pool of that backend (any, when None).
        """
        names = {p['name'] for p in self.pools()}
        return all(any(n.startswith(self.topo.node(k).name + '@' + (
            backend + '#' if backend else '')) for n in names)
            for k in nodes)

    def wait_volume_up(self, node, timeout=600):
        hosts = self.volume_hosts(node)
        since = self._volume_started.get(node)
        self._wait(lambda: self.services_up(hosts, since), timeout,
                   '%s reporting since its start' % ', '.join(hosts),
                   procs=['volume-' + node])

    # -- the whole stack ------------------------------------------------------

    def start(self):
        """Start the whole stack; return once every pool is listed.

        (The control plane's servers that run already are kept.)
        """
        self.install_configs()
        self._spawn_control_plane(CONTROL_PLANE)
        # The schema is synced while RabbitMQ boots (the slowest part).
        self._wait_control_plane(('mariadb',))
        self.create_database()
        self.sync_database()
        self._stamp('cinder database synced')
        self._wait_control_plane(('etcd', 'rabbitmq'))
        self._start_api()
        self._start_scheduler()
        self.start_volume('a')
        self.start_volume('b')
        hosts = self.volume_hosts('a') + self.volume_hosts('b')
        self._wait(lambda: self.services_up(hosts + ['controller']), 900,
                   'scheduler and both volume services reporting',
                   procs=['cinder-scheduler', 'volume-a', 'volume-b'])
        self._wait(lambda: _port_open(CONTROLLER, 8776), 600,
                   'cinder-api listening', procs=['cinder-api'])
        self._wait(self.pools_ready, 600, 'both nodes\' pools listed',
                   procs=['cinder-api', 'cinder-scheduler'])

    # -- the control plane going away and coming back ------------------------

    def _kill_group(self, name):
        """Kill ``name``'s process group at once, as a crash would."""
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        LOG.info('%s killed (process group %d)', name, proc.pid)

    def stop_rabbitmq(self):
        """The broker dies: every connection to it breaks, queues go.

        (The services' queues are not durable: what they held is lost.)
        """
        self._kill_group('rabbitmq')
        # The broker is not in the wrapper's process group (it runs as
        # user rabbitmq through su): in run 20261126-023104-552 it kept
        # serving after the group was killed.  Nothing else runs as
        # rabbitmq on the control plane's node.
        self._kill_user('rabbitmq', signal.SIGKILL)
        self._wait(lambda: not _port_open(CONTROLLER, 5672), 120,
                   'RabbitMQ gone')

    def _kill_user(self, user, sig):
        """Signal every process of ``user`` on the control plane's node."""
        self._control_run(['pkill', '-%d' % sig, '-u', user], check=False)

    def restart_rabbitmq(self):
        """Kill the broker and start it again; wait until it serves."""
        self.stop_rabbitmq()
        self.start_rabbitmq()
        self._wait(self.rabbitmq_ready, 900, 'RabbitMQ listening again',
                   procs=['rabbitmq'])

    @staticmethod
    def rpc_consumers(queue):
        """Consumers of a queue on the broker; 0 if it is not there."""
        import kombu
        try:
            with kombu.Connection('amqp://guest:guest@%s:5672//'
                                  % CONTROLLER,
                                  connect_timeout=5) as conn:
                _name, _count, consumers = conn.default_channel \
                    .queue_declare(queue=queue, passive=True)
            return consumers
        except Exception as exc:
            LOG.debug('queue %s: %s', queue, exc)
            return 0

    def wait_rpc_servers(self, hosts, timeout=300):
        """Until the volume services of ``hosts`` consume again.

        oslo.messaging declares a service's queues again when it has
        reconnected: ``cinder-volume.<host>@dmclone`` is its own.
        """
        queues = ['cinder-volume.%s@dmclone' % h for h in hosts]
        self._wait(lambda: all(self.rpc_consumers(q) for q in queues),
                   timeout, 'volume services consuming %s' % queues)

    def stop_mariadb(self):
        """The database dies (its files stay, as on a real server)."""
        self._kill_group('mariadb')
        self._wait(lambda: not _port_open(CONTROLLER, 3306), 120,
                   'MariaDB gone')

    def restart_mariadb(self):
        """Kill MariaDB and start it over the same data; wait for it.

        Unlike its first start, the data directory is kept: the
        cinder database must come back as it was (the testbed's
        ``innodb_flush_log_at_trx_commit = 2`` loses no commit when the
        server process dies).
        """
        self.stop_mariadb()
        self._start_mariadb_again()

    def _start_mariadb_again(self):
        self._spawn_mariadb()
        self._wait(lambda: self.mariadb_ready() and self._db(
            'SELECT COUNT(*) FROM services', check=False).isdigit(), 600,
            'MariaDB answering again', procs=['mariadb'])

    def start_again(self, name):
        """Start control-plane process ``name`` again, over its data.

        For one that died between tests (:func:`keep_running`): each is
        the child of its node link from node B, which kills it when the
        connection to the control plane's node drops.
        """
        if name == 'mariadb':
            self._start_mariadb_again()
        elif name == 'rabbitmq':
            self.restart_rabbitmq()
        elif name == 'etcd':
            self._spawn_etcd()
            self._wait_control_plane(('etcd',))
        elif name == 'cinder-api':
            self._start_api()
            self._wait(lambda: _port_open(CONTROLLER, 8776), 600,
                       'cinder-api listening again', procs=['cinder-api'])
        elif name == 'cinder-scheduler':
            since = self.db_now()
            self._start_scheduler()
            self._wait(lambda: self.services_up(['controller'], since),
                       600, 'cinder-scheduler reporting again',
                       procs=['cinder-scheduler'])
        else:
            raise StackError('%s is not a control-plane process' % name)

    def db_now(self):
        """The database's UTC time, as text (see services_up)."""
        return self._db('SELECT UTC_TIMESTAMP()')

    def pause_volume(self, node):
        """Freeze ``node``'s cinder-volume (SIGSTOP), wherever it is.

        Its RPC workers stop where they are, mid-step, as a service that
        is merely slow would.  Only a service whose processes are local
        (node B; node A in the one-kernel layout).
        """
        self._signal_volume(node, signal.SIGSTOP)

    def resume_volume(self, node):
        self._signal_volume(node, signal.SIGCONT)

    def _signal_volume(self, node, sig):
        if node == 'a' and self.topo.separate:
            raise StackError('node A\'s service runs in its own kernel')
        proc = self.procs['volume-' + node]
        os.killpg(proc.pid, sig)
        LOG.info('volume-%s sent signal %d', node, sig)

    def log_marks(self):
        """Where each cinder service log ends now (see error_records)."""
        return {name: os.path.getsize(os.path.join(self.log_dir, name))
                for name in os.listdir(self.log_dir)
                if name.startswith(('volume-', 'cinder-'))}

    def error_records(self, marks):
        """ERROR records written since ``marks``: (log, [lines]).

        A record is one logged message with its traceback: oslo.log
        repeats the same time, pid and logger on each of its lines.  A
        bare traceback on a service's stdout is one record too.
        """
        records = []
        for name in sorted(self.log_marks()):
            with open(os.path.join(self.log_dir, name),
                      errors='replace') as f:
                f.seek(marks.get(name, 0))
                lines = f.read().splitlines()
            records += _error_records(name, lines)
        return records

    def log_lines(self, marks, name, needle=None):
        """The lines of log ``name`` written since ``marks``, any level.

        ``name``: a file of the stack's log directory (``volume-a.log``:
        node A's volume service, whichever kernel it runs on: the run
        directory is every guest's).  With ``needle``, only the lines
        holding it.  (:meth:`error_records` gives the errors.)
        """
        path = os.path.join(self.log_dir, name)
        try:
            with open(path, errors='replace') as f:
                f.seek(marks.get(name, 0))
                lines = f.read().splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if needle is None or needle in line]

    def stop(self):
        for name in reversed(list(self.procs)):
            end_group(self.procs[name])
        if 'rabbitmq' in self.procs:
            # (see stop_rabbitmq: the broker outlives its wrapper's group)
            self._kill_user('rabbitmq', signal.SIGTERM)
            try:
                testbed.wait_until(
                    lambda: not _port_open(CONTROLLER, 5672), 120,
                    'RabbitMQ stopped')
            except testbed.WaitTimeout:
                self._kill_user('rabbitmq', signal.SIGKILL)
        self.procs.clear()

    def errors_in_logs(self):
        """ERROR/Traceback lines in the cinder service logs."""
        found = []
        for name in sorted(os.listdir(self.log_dir)):
            if not name.startswith(('volume-', 'cinder-')):
                continue
            with open(os.path.join(self.log_dir, name), errors='replace') as f:
                found += ['%s: %s' % (name, line.rstrip()) for line in f
                          if ' ERROR ' in line or 'Traceback' in line]
        return found


def running(s=None):
    """A started :class:`Stack` for a fixture to yield; stopped after.

    ``s``: a stack whose owner stops it (the session's control plane,
    :func:`tests.harness.pytest_fixtures.control_plane`): it is completed
    here, what already runs of it kept, and left running after.
    """
    owned = s is None
    if owned:
        s = Stack(testbed.topology())
    try:
        s.start()
    except BaseException:
        if owned:
            s.stop()
        raise
    LOG.info('stack up: %s', s.timings)
    yield s
    if owned:
        finish(s)


def finish(s):
    """Stop ``s``; log the cinder services' ERROR lines first.

    (Expected for the refusal scenarios; for the record otherwise.)  A
    stack that never started anything has neither.
    """
    if not s.procs:
        return
    errors = s.errors_in_logs()
    if errors:
        LOG.warning('ERROR lines in the service logs (expected for the '
                    'refusal scenarios):\n%s', '\n'.join(errors[-60:]))
    s.stop()


def keep_running(s, cloud):
    """Boot a node a scenario left powered off; restart dead services.

    (A scenario that fails between a power-off and the boot, or after it
    killed a volume service, must not fail every later test; the driver
    cluster's tests stop the volume services, see :meth:`Stack.
    stop_volumes`.)
    """
    for name in CONTROL_PLANE + CONTROL_SERVICES:
        if name in s.procs and not s.alive(name):
            LOG.warning('%s is not running (did its node link to the '
                        'control plane drop?): starting it again', name)
            s.start_again(name)
    if s.topo.separate and not testbed.answers('a'):
        LOG.warning('node A is down: booting it')
        cloud.forget_node('a')
        s.boot('a')
    # (The driver cluster's tests reboot node A.)
    cloud.forget_silent_nodes()
    for key in ('a', 'b'):
        name = 'volume-' + key
        if s.alive(name) and s.outlived_by(key):
            LOG.warning('node %s booted since %s started: its nodelink '
                        'outlived it; stopping it', key.upper(), name)
            end_group(s.procs[name])
        if not s.alive(name):
            LOG.info('%s is not running: starting it', name)
            s.restart_volume(key)
