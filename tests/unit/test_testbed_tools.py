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

"""The separate-kernel testbed's own tools, on this host.

``nodelink`` is what makes a process on another node behave as a local
child (the fault scenarios kill services with -9 through it), and the
runner's power control is what the reboot scenarios stand on: both are
checked here with real processes on the loopback interface, in seconds.
"""

import functools
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from cinder.tests.unit import test
import fixtures

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'tools', 'testbed')
NODELINK = os.path.join(TOOLS, 'guest', 'nodelink')


def load_runner():
    spec = importlib.util.spec_from_file_location(
        'testbed_runner', os.path.join(TOOLS, 'runner.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _zombie(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
        return True


class NodelinkTestCase(test.TestCase):

    def setUp(self):
        super(NodelinkTestCase, self).setUp()
        self.port = str(free_port())
        self.server = subprocess.Popen(
            [sys.executable, NODELINK, 'serve', '127.0.0.1', self.port],
            stderr=subprocess.DEVNULL)
        self.addCleanup(self._stop_server)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(('127.0.0.1', int(self.port)),
                                         timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _stop_server(self):
        self.server.kill()
        self.server.wait()

    def caller(self, *argv, **kwargs):
        return subprocess.Popen(
            [sys.executable, NODELINK, 'exec', '127.0.0.1', self.port]
            + list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            **kwargs)

    def test_streams_status_environment_and_directory_pass_through(self):
        with tempfile.TemporaryDirectory() as cwd:
            proc = self.caller(
                'sh', '-c', 'read x; echo "out $x $NODELINK_T $(pwd)"; '
                'echo err >&2; exit 7', stdin=subprocess.PIPE, cwd=cwd,
                env=dict(os.environ, NODELINK_T='env-ok'))
            out, err = proc.communicate(b'hello\n', timeout=60)
        self.assertEqual(7, proc.returncode)
        self.assertEqual(b'out hello env-ok %s\n' % os.path.realpath(
            cwd).encode(), out)
        self.assertEqual(b'err\n', err)

    def test_binary_data_passes_unchanged(self):
        data = os.urandom(3 * 1024 * 1024)
        proc = self.caller('cat', stdin=subprocess.PIPE)
        out, _err = proc.communicate(data, timeout=60)
        self.assertEqual(0, proc.returncode)
        self.assertEqual(data, out)

    def _remote_pid(self, proc):
        line = proc.stdout.readline()
        self.assertTrue(line.startswith(b'pid '), line)
        return int(line.split()[1])

    def _wait_gone(self, pid):
        deadline = time.monotonic() + 30
        while pid_alive(pid):
            self.assertLess(time.monotonic(), deadline,
                            'remote process %d still running' % pid)
            time.sleep(0.05)

    def test_sigterm_of_the_caller_reaches_the_command(self):
        proc = self.caller('sh', '-c', 'echo pid $$; exec sleep 300')
        pid = self._remote_pid(proc)
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(128 + signal.SIGTERM, proc.wait(timeout=30))
        self._wait_gone(pid)

    def test_kill_9_of_the_caller_kills_the_command(self):
        """What makes kill -9 of a service's local end a hard kill."""
        proc = self.caller('sh', '-c', 'echo pid $$; exec sleep 300')
        pid = self._remote_pid(proc)
        proc.kill()
        proc.wait(timeout=30)
        self._wait_gone(pid)

    def test_signals_and_hang_up_pass_a_command_not_reading_stdin(self):
        big = b'x' * (8 * 1024 * 1024)
        for how in ('sigterm', 'kill'):
            proc = self.caller('sh', '-c', 'echo pid $$; exec sleep 300',
                               stdin=subprocess.PIPE)
            pid = self._remote_pid(proc)
            writer = threading.Thread(
                target=self._feed, args=(proc, big), daemon=True)
            writer.start()
            time.sleep(0.5)      # the node's stdin pipe is full by now
            if how == 'sigterm':
                proc.send_signal(signal.SIGTERM)
            else:
                proc.kill()
            proc.wait(timeout=30)
            self._wait_gone(pid)

    @staticmethod
    def _feed(proc, data):
        try:
            proc.stdin.write(data)
            proc.stdin.close()
        except OSError:
            pass

    def test_background_children_end_with_the_command(self):
        proc = self.caller('sh', '-c', 'sleep 300 & echo pid $!')
        pid = self._remote_pid(proc)
        t0 = time.monotonic()
        self.assertEqual(0, proc.wait(timeout=60))
        self.assertLess(time.monotonic() - t0, 5)
        self._wait_gone(pid)

    def test_a_missing_command_is_127_with_a_message(self):
        proc = self.caller('/nonexistent/command')
        _out, err = proc.communicate(timeout=60)
        self.assertEqual(127, proc.returncode)
        self.assertIn(b'/nonexistent/command', err)

    def test_an_unreachable_node_is_255(self):
        proc = subprocess.run(
            [sys.executable, NODELINK, 'exec', '127.0.0.1',
             str(free_port()), 'true'], capture_output=True, timeout=60)
        self.assertEqual(255, proc.returncode)
        self.assertIn(b'cannot reach', proc.stderr)


class FakeGuest(object):
    def __init__(self):
        self.proc = None
        self.calls = []

    def boot(self):
        self.calls.append('boot')
        self.proc = subprocess.Popen(['sleep', '300'])

    def died(self):
        return False

    def power_off(self):
        self.calls.append('power-off')
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


class PowerControlTestCase(test.TestCase):

    def setUp(self):
        super(PowerControlTestCase, self).setUp()
        self.runner = load_runner()
        self.run_dir = self.useFixture(fixtures.TempDir()).path
        os.makedirs(os.path.join(self.run_dir, 'ctl'))
        self.guest = FakeGuest()
        self.addCleanup(self.guest.power_off)
        self.power = self.runner.PowerControl(self.run_dir,
                                              {'a': self.guest})

    def test_power_off_then_boot(self):
        self.guest.boot()
        self.assertEqual('ok', self.power.act(['power-off', 'a']))
        self.assertIsNone(self.guest.proc)
        self.assertEqual('ok', self.power.act(['boot', 'a']))
        self.assertEqual(['boot', 'power-off', 'boot'], self.guest.calls)

    def test_booting_a_running_node_is_refused(self):
        self.guest.boot()
        self.assertEqual('node a is running',
                         self.power.act(['boot', 'a']))
        self.assertEqual(['boot'], self.guest.calls)

    def test_nothing_is_served_once_stopped(self):
        self.power.stop()
        self.assertEqual('the run is ending', self.power.act(['boot', 'a']))
        self.assertEqual([], self.guest.calls)

    def test_a_guest_dies_with_the_runner(self):
        """Guests get SIGKILL when the runner dies (no orphan kernels)."""
        script = ('import subprocess, sys, importlib.util\n'
                  'spec = importlib.util.spec_from_file_location("r", %r)\n'
                  'r = importlib.util.module_from_spec(spec)\n'
                  'spec.loader.exec_module(r)\n'
                  'p = subprocess.Popen(["sleep", "300"], '
                  'preexec_fn=r.die_with_runner)\n'
                  'print(p.pid, flush=True)\n'
                  'sys.stdin.read()\n' % os.path.join(TOOLS, 'runner.py'))
        runner = subprocess.Popen([sys.executable, '-c', script],
                                  stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        pid = int(runner.stdout.readline())
        self.assertTrue(pid_alive(pid))
        runner.kill()
        runner.wait()
        deadline = time.monotonic() + 30
        while pid_alive(pid) and not _zombie(pid):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)

    def test_bad_requests_are_answered_not_acted_on(self):
        for words in (['reboot', 'a'], ['boot', 'b'], ['boot'], []):
            self.assertTrue(self.power.act(words).startswith('bad request'),
                            words)
        self.assertEqual([], self.guest.calls)

    def test_requests_are_served_through_the_directory(self):
        self.guest.boot()
        ctl = os.path.join(self.run_dir, 'ctl')
        with open(os.path.join(ctl, '1-x.request'), 'w') as f:
            f.write('power-off a\n')
        self.power.start()
        self.addCleanup(self.power.stop)
        done = os.path.join(ctl, '1-x.done')
        deadline = time.monotonic() + 30
        while not os.path.exists(done):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        with open(done) as f:
            self.assertEqual('ok\n', f.read())
        self.assertFalse(os.path.exists(os.path.join(ctl, '1-x.request')))
        self.assertIsNone(self.guest.proc)


class GuestCommandTestCase(test.TestCase):
    """What the runner puts on the guests' kernel command lines."""

    def setUp(self):
        super().setUp()
        self.runner = load_runner()
        self.run_dir = self.useFixture(fixtures.TempDir()).path

    def command(self, *own, node=None):
        args = self.runner.parse_args(list(own) + ['--', '-k', 'x'])
        return self.runner.uml_command(args, '/rootfs', self.run_dir, node,
                                       '/run/switch.ctl')

    def test_kernel_messages_stay_off_the_console_from_the_first(self):
        for node in ('a', 'b', 'c'):
            self.assertIn('loglevel=1', self.command('--layout', 'separate',
                                                     node=node))
        self.assertIn('loglevel=1', self.command())

    def test_node_c_has_its_own_address_and_disks(self):
        cmd = self.command('--layout', 'separate', node='c')
        self.assertIn('testbed.node=c', cmd)
        self.assertIn('eth0=daemon,52:54:00:dc:00:03,unix,/run/switch.ctl',
                      cmd)
        self.assertEqual(
            ['ubd1=%s/vgs/c/dmc-c.img' % self.run_dir,
             'ubd2=%s/vgs/c/dmc-c-meta.img' % self.run_dir],
            [a for a in cmd if a.startswith('ubd')])
        self.assertEqual(len(set(self.runner.NODE_MAC.values())),
                         len(self.runner.NODE_MAC))


class ModuleTimingsTestCase(test.TestCase):
    """The functional suites' per-module timings (their terminal summary)."""

    def test_every_phase_counts_for_its_module(self):
        from tests.harness import selection

        class Report(object):
            def __init__(self, nodeid, when, duration):
                self.nodeid, self.when, self.duration = nodeid, when, duration

        stats = {
            '': [Report('t/a.py::x', 'setup', 100.0),
                 Report('t/a.py::x', 'teardown', 1.0),
                 Report('t/b.py::y', 'setup', 0.5)],
            'passed': [Report('t/a.py::x', 'call', 10.0),
                       Report('t/b.py::y', 'call', 20.0)],
            'failed': [Report('t/b.py::z', 'call', 30.0)],
            'deselected': [object()],
        }
        self.assertEqual(
            [('t/a.py', (111.0, 1)), ('t/b.py', (50.5, 2))],
            selection.module_timings(stats))


class ErrorRecordsTestCase(test.TestCase):
    """Stack.error_records: a logged error and its traceback are one."""

    def test_records(self):
        from tests.harness import services
        prefix = '2026-11-26 01:49:22.716 1234 '
        lines = [
            prefix + 'INFO cinder.x [-] fine',
            prefix + 'ERROR impl_rabbit [-] AMQP server is unreachable',
            prefix + 'ERROR cinder.service [-] model server went away',
            prefix + 'ERROR cinder.service Traceback (most recent call):',
            prefix + 'ERROR cinder.service DBConnectionError: (2003)',
            prefix + 'WARNING cinder.x [-] w',
            'Traceback (most recent call last):',
            '  File "x", line 1',
            'ValueError: boom',
            prefix + 'INFO cinder.x [-] fine',
        ]
        records = services._error_records('volume-a.log', lines)
        self.assertEqual([lines[1:2], lines[2:5], lines[6:9]],
                         [r[1] for r in records])
        self.assertEqual({'volume-a.log'}, {r[0] for r in records})


class EndGroupTestCase(test.TestCase):
    """Stack.stop ends whole process groups, not only their leaders."""

    def _group(self, script):
        proc = subprocess.Popen(['sh', '-c', script],
                                start_new_session=True)
        self.addCleanup(self._kill, proc.pid)
        time.sleep(0.3)
        return proc

    @staticmethod
    def _kill(pgid):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def assertGone(self, pgid):
        self.assertRaises(ProcessLookupError, os.killpg, pgid, 0)

    def test_members_that_outlive_the_leader_are_waited_for(self):
        from tests.harness import services
        # the leader exits at SIGTERM; its child takes a second longer
        proc = self._group('(trap "sleep 1; exit 0" TERM; '
                           'while :; do sleep 0.1; done) & '
                           'trap "exit 0" TERM; wait')
        services.end_group(proc, grace=30)
        self.assertGone(proc.pid)

    def test_members_ignoring_sigterm_are_killed(self):
        from tests.harness import services
        proc = self._group('trap "" TERM; sleep 300 & sleep 300')
        t0 = time.monotonic()
        services.end_group(proc, grace=1)
        self.assertGone(proc.pid)
        self.assertLess(time.monotonic() - t0, 20)


def fake_topology(layout, artifacts_dir='/nonexistent'):
    """A topology as the guest's init writes it, for ``layout``."""
    from tests.harness import testbed
    nodes = {}
    for i, key in enumerate('abc', 1):
        meta_vg = 'dmc-%s-meta' % key
        if layout != 'separate' and key != 'b':
            meta_vg = None
        nodes[key] = testbed.Node(
            key=key, name='node-' + key, hostname='node' + key,
            netns=None, ip='10.0.0.%d' % i, exec_prefix=(),
            vg='dmc-' + key, initiator_iqn=None, meta_vg=meta_vg)
    if layout != 'separate':
        del nodes['c']
    return testbed.Topology(
        raw={}, a=nodes['a'], b=nodes['b'], lvm_conf='/etc/cinder/lvm.conf',
        lvm_system_dir='/etc/cinder', python=sys.executable, src='/src',
        artifacts_dir=artifacts_dir, iscsi_port=3260, layout=layout,
        nodes=nodes)


class ControlPlaneTestCase(test.TestCase):
    """The control plane's servers start once, for the stack or cluster."""

    def setUp(self):
        super().setUp()
        from tests.harness import services
        self.stack = services.Stack(fake_topology(
            'separate', self.useFixture(fixtures.TempDir()).path))
        self.started = []
        self.waited = []
        for name in services.CONTROL_PLANE:
            self.useFixture(fixtures.MockPatchObject(
                self.stack, 'start_' + name,
                side_effect=functools.partial(self.started.append, name)))
        self.useFixture(fixtures.MockPatchObject(
            self.stack, '_install_control_plane'))
        self.useFixture(fixtures.MockPatchObject(
            self.stack, '_wait',
            side_effect=lambda predicate, timeout, what, procs: (
                self.waited.extend(procs))))

    def test_what_runs_already_is_kept(self):
        self.useFixture(fixtures.MockPatchObject(
            self.stack, 'alive', side_effect=lambda name: name == 'mariadb'))
        self.stack.start_control_plane(('mariadb', 'etcd'))
        self.assertEqual(['etcd'], self.started)
        self.assertEqual(['mariadb', 'etcd'], self.waited)

    def test_the_whole_control_plane_by_default(self):
        self.useFixture(fixtures.MockPatchObject(self.stack, 'alive',
                                                 return_value=False))
        self.stack.start_control_plane()
        self.assertEqual(['mariadb', 'rabbitmq', 'etcd'], self.started)
        self.assertEqual(['mariadb', 'etcd', 'rabbitmq'], self.waited)

    def test_only_the_volume_services_stop(self):
        procs = {name: subprocess.Popen(['sleep', '60'],
                                        start_new_session=True)
                 for name in ('volume-a', 'mariadb', 'etcd')}
        for proc in procs.values():
            self.addCleanup(EndGroupTestCase._kill, proc.pid)
        procs['volume-b'] = subprocess.Popen(['true'])
        procs['volume-b'].wait()
        self.stack.procs.update(procs)
        self.stack.stop_volumes()
        self.assertIsNotNone(procs['volume-a'].poll())
        self.assertEqual({'mariadb', 'etcd'},
                         {n for n, p in procs.items() if p.poll() is None})
