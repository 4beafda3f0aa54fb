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
So are the harness's choices per layout: what the driver cluster's two
services share, where their peer calls go (and the TCP listener), which
node holds a device, on which kernel a functional fixture's LV is made,
the network cut's tc commands between kernels, and the control plane
that the full stack and the cluster start piecemeal.
"""

import dataclasses
import functools
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

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


def load_nodelink():
    spec = importlib.util.spec_from_loader(
        'nodelink', importlib.machinery.SourceFileLoader('nodelink',
                                                         NODELINK))
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

    def test_the_node_hangs_up_only_after_its_caller(self):
        """The node never resets the link before its caller has the status.

        A node that closed its end while the caller's frames were still
        arriving reset the connection, and the reset threw away the exit
        status it had just queued: in CI run 20261127-191702-8399 a
        ``cat /proc/sys/kernel/random/boot_id`` on node A printed its
        output, then its caller got ECONNRESET and no status (255).
        Here the caller keeps talking after the status, as a caller whose
        queued stdin frames are late would: the node must end with a clean
        end of stream once the caller hangs up, never a reset.
        """
        nodelink = load_nodelink()
        sock = socket.create_connection(('127.0.0.1', int(self.port)),
                                        timeout=30)
        self.addCleanup(sock.close)
        nodelink.send_frame(sock, b'h', json.dumps({
            'argv': ['true'], 'env': {'PATH': os.environ['PATH']},
            'cwd': '/'}).encode())
        kinds = []
        while not kinds or kinds[-1] != b'x':
            kinds.append(nodelink.recv_frame(sock)[0])
        for _ in range(3):
            time.sleep(0.2)
            nodelink.send_frame(sock, b'i', b'late')
        sock.shutdown(socket.SHUT_WR)
        self.assertEqual(b'', sock.recv(1))

    def _diagnose(self, port):
        nodelink = load_nodelink()
        err = io.StringIO()
        self.useFixture(fixtures.MonkeyPatch('sys.stderr', err))
        nodelink.diagnose('127.0.0.1', port)
        return err.getvalue()

    def test_a_timed_out_caller_shows_the_node_from_a_new_connection(self):
        text = self._diagnose(self.port)
        self.assertIn('nodelink: 127.0.0.1: the node answers a new '
                      'connection', text)
        self.assertIn('nodelink: 127.0.0.1: uptime: ', text)

    def test_a_node_gone_for_good_is_said_so(self):
        text = self._diagnose(str(free_port()))
        self.assertIn('the node does not answer a new connection', text)

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


class AnswersTestCase(test.TestCase):
    """Whether a node is up, as the fixtures that boot a downed node ask.

    A node judged down while it runs is booted again, which the runner
    refuses ("node a is running"), and the test errors in its setup: run
    20261128-054438-15154, where node A, busy hydrating under emulation
    on a slow machine, took longer than 15 s to run ``true``.
    """

    def setUp(self):
        super().setUp()
        from tests.harness import testbed
        self.testbed = testbed

    def node_that_answers_after(self, seconds):
        """``testbed.run`` over a node that needs ``seconds`` to answer."""
        def run(cmd, node=None, check=True, timeout=300, **kwargs):
            if timeout < seconds:
                raise subprocess.TimeoutExpired(cmd, timeout)
            return subprocess.CompletedProcess(cmd, 0, '', '')
        return self.useFixture(fixtures.MockPatch(
            'tests.harness.testbed.run', side_effect=run)).mock

    def test_a_busy_node_still_answers(self):
        run = self.node_that_answers_after(60)
        self.assertTrue(self.testbed.answers('a'))
        self.assertEqual('a', run.call_args.kwargs['node'])

    def test_a_node_that_never_answers_is_down(self):
        self.node_that_answers_after(float('inf'))
        self.assertFalse(self.testbed.answers('a'))

    def test_a_powered_off_node_is_down(self):
        # on-node's connection is refused or unreachable: it exits non-zero
        self.useFixture(fixtures.MockPatch(
            'tests.harness.testbed.run',
            return_value=subprocess.CompletedProcess(['true'], 255)))
        self.assertFalse(self.testbed.answers('a'))


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

    def test_every_node_joins_the_switchs_namespace(self):
        args = self.runner.parse_args(['--layout', 'separate', '--', 'x'])
        for node in ('a', 'b', 'c'):
            cmd = self.runner.uml_command(args, '/rootfs', self.run_dir,
                                          node, '/run/switch.ctl',
                                          '/proc/7/ns/net')
            self.assertEqual(['nsenter', '--net=/proc/7/ns/net', '--'],
                             cmd[:3])
        self.assertNotIn('nsenter', self.command())

    @unittest.skipUnless(os.geteuid() == 0, 'a network namespace needs root')
    def test_the_queue_is_deep_on_the_segment_and_left_alone_here(self):
        path = '/proc/sys/net/unix/max_dgram_qlen'
        with open(path) as f:
            here = f.read()
        switch = subprocess.Popen(self.runner.on_segment(['sleep', '300']))
        self.addCleanup(switch.wait)
        self.addCleanup(switch.kill)
        segment = '/proc/%d/ns/net' % switch.pid

        def guest_sees():
            return subprocess.run(
                self.runner.joining(segment, ['cat', path]),
                capture_output=True, text=True, check=True,
                timeout=60).stdout.strip()
        # the wrapper writes the queue length before it execs the switch
        deadline = time.monotonic() + 60
        while guest_sees() != str(self.runner.SEGMENT_QUEUE):
            self.assertLess(time.monotonic(), deadline, guest_sees())
            time.sleep(0.1)
        self.assertNotEqual(os.readlink('/proc/self/ns/net'),
                            os.readlink(segment))
        with open(path) as f:
            self.assertEqual(here, f.read())

    def test_node_c_has_its_own_address_and_disks(self):
        cmd = self.command('--layout', 'separate', node='c')
        self.assertIn('testbed.node=c', cmd)
        self.assertIn('eth0=daemon,52:54:00:dc:00:03,unix,/run/switch.ctl',
                      cmd)
        self.assertEqual(
            ['ubd1=%s/vgs/c/dmc-c.img' % self.run_dir,
             'ubd2=%s/vgs/c/dmc-c-meta.img' % self.run_dir,
             'ubd3=%s/vgs/c/dmc-c-thin.img' % self.run_dir],
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
            vg='dmc-' + key, initiator_iqn=None, meta_vg=meta_vg,
            thin_vg='dmc-%s-thin' % key if layout == 'separate' else None)
    if layout != 'separate':
        del nodes['c']
    control = nodes['b']
    if layout == 'separate':
        control = testbed._control_node(
            {'key': 'cp', 'name': 'controller', 'hostname': 'nodecp',
             'ip': '10.0.0.10',
             'exec': ['/src/tools/testbed/guest/on-node', 'cp']}, None)
    return testbed.Topology(
        raw={}, a=nodes['a'], b=nodes['b'], lvm_conf='/etc/cinder/lvm.conf',
        lvm_system_dir='/etc/cinder', python=sys.executable, src='/src',
        artifacts_dir=artifacts_dir, iscsi_port=3260, layout=layout,
        nodes=nodes, control=control)


class DriverClusterLayoutTestCase(test.TestCase):
    """What the driver cluster's two services share, per testbed layout."""

    def test_one_kernel_shares_a_file_system(self):
        from cinder_dmclone import move
        from tests.harness import volume_node
        shared = volume_node.shared_state(separate=False)
        self.assertEqual('sqlite:////srv/cinder-ft/cinder.sqlite',
                         shared.database)
        self.assertEqual('file:///srv/cinder-ft/locks', shared.coordination)
        # The driver accepts file locks only when they are stated shared.
        move.check_coordination(shared.coordination,
                                shared.shared_file_locks)
        self.assertTrue(shared.shared_file_locks)

    def test_separate_kernels_share_the_control_plane(self):
        from cinder_dmclone import exception
        from cinder_dmclone import move
        from tests.harness import volume_node
        shared = volume_node.shared_state(separate=True)
        self.assertEqual(
            'mysql+pymysql://cinder:cinder@controller/cinder_ft?'
            'charset=utf8', shared.database)
        self.assertEqual(
            'etcd3+http://controller:2379?api_version=v3&timeout=60',
            shared.coordination)
        self.assertFalse(shared.shared_file_locks)
        move.check_coordination(shared.coordination,
                                shared.shared_file_locks)
        # (What each kernel's own file locks would meet.)
        self.assertRaises(exception.NodeLocalCoordination,
                          move.check_coordination,
                          volume_node.shared_state(False).coordination,
                          shared.shared_file_locks)

    def test_peer_calls_go_to_a_socket_file_or_the_node_address(self):
        from tests.harness import volume_node
        one = fake_topology('one-kernel')
        self.assertEqual('/srv/cinder-ft/peer-a.sock',
                         volume_node.peer_address(one, 'a'))
        self.assertEqual('/srv/cinder-ft/peer-b.sock',
                         volume_node.peer_address(one, 'b'))
        separate = fake_topology('separate')
        self.assertEqual(('10.0.0.1', volume_node.PEER_PORT),
                         volume_node.peer_address(separate, 'a'))
        self.assertEqual(('10.0.0.2', volume_node.PEER_PORT),
                         volume_node.peer_address(separate, 'b'))

    def test_a_device_is_on_the_node_of_its_volume_group(self):
        from tests.harness import driver_cluster
        topo = fake_topology('separate')
        for path, node in [
                ('/dev/mapper/dmclone-dmc--a-volume-1-2', 'a'),
                ('/dev/mapper/dmclone-dmc--b-volume-1-2', 'b'),
                ('/dev/dmc-a/volume-1-2', 'a'),
                ('/dev/dmc-b/volume-1-2-dmcwipe-3', 'b'),
                ('/dev/dmc-b-meta/volume-1-2-dmcmeta', 'b'),
                ('/dev/dmc-a-meta/volume-1-2-dmcmeta', 'a'),
                ('/dev/mapper/dmclone-dmc--c-volume-1', 'c')]:
            self.assertEqual(node, driver_cluster.device_node(topo, path),
                             path)
        for path in ('/dev/sdb', '/dev/dmc-ab/volume-1',
                     '/dev/mapper/dmc--a-volume--1',
                     '/dev/mapper/dmclone-dmc--ab-volume-1'):
            self.assertRaises(ValueError, driver_cluster.device_node, topo,
                              path)
        one = fake_topology('one-kernel')
        self.assertEqual('b', driver_cluster.device_node(
            one, '/dev/dmc-b-meta/volume-1-dmcmeta'))
        self.assertRaises(ValueError, driver_cluster.device_node, one,
                          '/dev/dmc-c/volume-1')

    def test_one_kernel_looks_at_a_node_here(self):
        from tests.harness import testbed
        from tests.harness import workers
        self.useFixture(fixtures.MockPatchObject(
            testbed, 'topology', return_value=fake_topology('one-kernel')))
        calls = workers.NodeCalls()
        self.assertEqual(os.getpid(), calls.call('a', os.getpid))
        self.assertEqual({}, calls._workers)

    def test_root_commands_since_marks_per_node(self):
        from tests.harness import testbed
        from tests.harness import volume_node
        logs = {'a': 'ok lvs\n', 'b': 'ok dmsetup status\n'}
        read = self.useFixture(fixtures.MockPatchObject(
            testbed, 'read_text', side_effect=lambda path, node: logs[node]
        )).mock
        marks = volume_node.root_command_marks()
        self.assertEqual({'a': 1, 'b': 1}, marks)
        read.assert_any_call('/srv/cinder-ft/rootwrap-commands-a.log', 'a')
        logs['a'] += 'REFUSED dd if=/dev/zero of=/dev/x\n'
        logs['b'] += 'ok lvs\nfailed lvremove x\n'
        self.assertEqual(['REFUSED dd if=/dev/zero of=/dev/x', 'ok lvs',
                          'failed lvremove x'],
                         volume_node.root_commands(marks))
        self.assertEqual(5, len(volume_node.root_commands()))


class LvOnItsKernelTestCase(test.TestCase):
    """The functional fixtures' LVs are made on the kernel of their VG."""

    def _topology(self, layout):
        from tests.harness import testbed
        self.useFixture(fixtures.MockPatchObject(
            testbed, 'topology', return_value=fake_topology(layout)))
        self.useFixture(fixtures.MockPatchObject(
            testbed, 'local_node', return_value='b'))

    def test_separate_kernels_each_vg_on_its_node(self):
        from tests.harness import testbed
        self._topology('separate')
        for vg, node in [('dmc-a', 'a'), ('dmc-a-meta', 'a'),
                         ('dmc-a-thin', 'a'), ('dmc-b', 'b'),
                         ('dmc-b-meta', 'b'), ('dmc-b-thin', 'b'),
                         ('dmc-c', 'c')]:
            self.assertEqual(node, testbed.kernel_of(vg), vg)
        self.assertRaises(ValueError, testbed.kernel_of, 'dmc-ab')

    def test_one_kernel_every_vg_here(self):
        from tests.harness import testbed
        self._topology('one-kernel')
        self.assertEqual('b', testbed.kernel_of('dmc-a'))
        self.assertEqual('b', testbed.kernel_of('dmc-b-meta'))

    def test_an_lv_on_another_kernel_is_made_and_removed_there(self):
        from tests.harness import testbed
        self._topology('separate')
        calls = []

        def run(cmd, node='b', check=True, **kwargs):
            calls.append((cmd[:2], node, check))
            out = 'dmc-a/x\n' if cmd[:2] == ['lvm', 'lvs'] else ''
            return subprocess.CompletedProcess(cmd, 0, out, '')
        self.useFixture(fixtures.MockPatchObject(testbed, 'run', run))
        exists = self.useFixture(fixtures.MockPatchObject(
            os.path, 'exists', return_value=False)).mock
        self.assertEqual('/dev/dmc-a/x',
                         testbed.create_lv('dmc-a', 'x', 4096, node='a'))
        testbed.remove_lv('dmc-a', 'x', node='a')
        self.assertEqual([(['lvm', 'lvcreate'], 'a', True),
                          (['test', '-e'], 'a', False),
                          (['lvm', 'lvs'], 'a', True),
                          (['lvm', 'lvremove'], 'a', True)], calls)
        # (node B's view of the device node was never asked)
        exists.assert_not_called()


class NetemOnPortTestCase(test.TestCase):
    """The network fault's tc commands between separate kernels."""

    def test_only_the_ports_packets_meet_netem(self):
        from tests.harness import testbed
        commands = testbed.netem_on_port('eth0', 3260,
                                         ('delay', '2ms', 'loss', '100%'))
        self.assertEqual(
            'tc qdisc add dev eth0 root handle 1: prio bands 4',
            ' '.join(commands[0]))
        self.assertEqual(
            ['tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match '
             'ip %s 3260 0xffff flowid 1:4' % d for d in ('sport', 'dport')],
            [' '.join(c) for c in commands[1:3]])
        self.assertEqual('tc qdisc add dev eth0 parent 1:4 handle 40: netem '
                         'delay 2ms loss 100%', ' '.join(commands[3]))
        self.assertEqual(4, len(commands))


REPO = os.path.dirname(os.path.dirname(TOOLS))

#: Node A's peer endpoint on the loopback (port: argv[1]); a caller with
#: a wrong key, then one with the right key.
PEER_SCRIPT = """
import multiprocessing
import multiprocessing.connection
import sys
import types
from unittest import mock

from tests.harness import testbed
from tests.harness import volume_node

port = int(sys.argv[1])
node = types.SimpleNamespace(ip='127.0.0.1')
topo = types.SimpleNamespace(separate=True, node=lambda key: node)
with mock.patch.object(testbed, 'topology', return_value=topo), \\
        mock.patch.object(volume_node, 'PEER_PORT', port), \\
        mock.patch.object(volume_node, '_handle',
                          side_effect=lambda *args: args):
    volume_node._serve_peer('a')
    address = ('127.0.0.1', port)
    try:
        multiprocessing.connection.Client(address, authkey=b'wrong')
    except multiprocessing.AuthenticationError as exc:
        print('refused', type(exc).__name__)
    with multiprocessing.connection.Client(
            address, authkey=volume_node.PEER_AUTHKEY) as conn:
        conn.send(('terminate_connection', {'v': 1}, {'host': 'x'}))
        assert conn.poll(30)
        print('served', conn.recv())
"""


#: Node A's peer endpoint (port: argv[1]) while a step it runs blocks: the
#: caller of that step gives up after its timeout, and the next call (an
#: abort, say) is still answered, as by a volume service's RPC workers.
#: Then a port that takes connections but never answers: a call to it
#: gives up after its timeout too (a peer whose service hangs).
PEER_BLOCKED_SCRIPT = """
import socket
import sys
import threading
import time
import types
from unittest import mock

import oslo_messaging

from tests.harness import testbed
from tests.harness import volume_node

port, silent_port = int(sys.argv[1]), int(sys.argv[2])
# Each call's timeout is 3 s; a loaded machine may take longer to
# notice, but a call held by the blocked step waits 120 s.
BOUND = 40
node = types.SimpleNamespace(ip='127.0.0.1', name='node-a')
topo = types.SimpleNamespace(separate=True, node=lambda key: node)
release = threading.Event()


def handle(method, primitive, connector):
    if connector.get('block'):
        release.wait(120)
    return connector


routed = types.SimpleNamespace(host='node-a@dmclone')
with mock.patch.object(testbed, 'topology', return_value=topo), \\
        mock.patch.object(volume_node, 'PEER_PORT', port), \\
        mock.patch.object(volume_node, '_handle', side_effect=handle):
    volume_node._serve_peer('a')
    rpc = volume_node.SocketRPC('a', timeout=3)
    for connector in ({'block': True}, {'n': 2}):
        t0 = time.monotonic()
        try:
            print('answered', rpc._send('terminate_connection', routed,
                                        connector), end=' ')
        except oslo_messaging.MessagingTimeout:
            print('timed out', end=' ')
        print(time.monotonic() - t0 < BOUND)
    release.set()
    silent = socket.socket()
    silent.bind(('127.0.0.1', silent_port))
    silent.listen(4)
    with mock.patch.object(volume_node, 'PEER_PORT', silent_port):
        t0 = time.monotonic()
        try:
            rpc._send('terminate_connection', routed, {'n': 3})
        except oslo_messaging.MessagingTimeout:
            print('silent peer: timed out', time.monotonic() - t0 < BOUND)
    # A caller that connects and never answers the key exchange (its
    # node frozen or powered off mid-call) holds no other caller.
    mute = socket.create_connection(('127.0.0.1', port))
    t0 = time.monotonic()
    try:
        print('after a mute caller: answered',
              rpc._send('terminate_connection', routed, {'n': 4}), end=' ')
    except oslo_messaging.MessagingTimeout:
        print('after a mute caller: timed out', end=' ')
    print(time.monotonic() - t0 < BOUND)
    mute.close()
"""


class PeerListenerTestCase(test.TestCase):
    """The driver cluster's peer calls over TCP, between separate kernels."""

    def setUp(self):
        super().setUp()
        from tests.harness import testbed
        from tests.harness import volume_node
        self.vn = volume_node
        self.port = free_port()
        self.useFixture(fixtures.MockPatchObject(volume_node, 'PEER_PORT',
                                                 self.port))
        topo = fake_topology('separate')
        topo.nodes['a'] = dataclasses.replace(topo.a, ip='127.0.0.1')
        self.useFixture(fixtures.MockPatchObject(testbed, 'topology',
                                                 return_value=topo))
        self.addCleanup(volume_node._STATE.pop, 'listener', None)

    def test_a_caller_without_the_key_is_refused_then_others_served(self):
        # In a fresh interpreter: these unit tests run under eventlet's
        # monkey patching, whose sockets multiprocessing cannot use (the
        # workers in the guest are not patched).
        proc = subprocess.run(
            [sys.executable, '-c', PEER_SCRIPT, str(self.port)],
            capture_output=True, text=True, timeout=60,
            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual(['refused AuthenticationError',
                          "served (True, ('terminate_connection', "
                          "{'v': 1}, {'host': 'x'}))"],
                         proc.stdout.splitlines())

    # Review of the fault matrix on separate kernels: node B's prepare
    # blocked in an iSCSI login under a network cut, node A's abort that
    # followed its timed out prepare waited for B's single request loop,
    # its call not bounded at all: node A's attach never returned.
    def test_a_blocked_step_neither_blocks_the_next_nor_its_caller(self):
        proc = subprocess.run(
            [sys.executable, '-c', PEER_BLOCKED_SCRIPT, str(self.port),
             str(free_port())],
            capture_output=True, text=True, timeout=300,
            cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual(['timed out True', "answered {'n': 2} True",
                          'silent peer: timed out True',
                          "after a mute caller: answered {'n': 4} True"],
                         proc.stdout.splitlines(), proc.stderr)

    def test_a_port_still_held_is_waited_for(self):
        address = ('127.0.0.1', self.port)
        first = self.vn._listen(address)
        timer = threading.Timer(1.0, first.close)
        timer.start()
        self.addCleanup(timer.cancel)
        t0 = time.monotonic()
        second = self.vn._listen(address)
        second.close()
        self.assertGreater(time.monotonic() - t0, 0.5)

    def test_a_port_held_too_long_fails_the_start(self):
        import errno
        self.useFixture(fixtures.MockPatchObject(self.vn,
                                                 'PEER_BIND_TIMEOUT', 1))
        address = ('127.0.0.1', self.port)
        first = self.vn._listen(address)
        self.addCleanup(first.close)
        err = self.assertRaises(OSError, self.vn._listen, address)
        self.assertEqual(errno.EADDRINUSE, err.errno)


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
                self.stack, '_spawn_' + name,
                side_effect=functools.partial(self.started.append, name)))
        self.on_control = self.useFixture(fixtures.MockPatchObject(
            self.stack, '_on_control')).mock
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
        # its node visited once: configuration, and fresh data for etcd
        from tests.harness import services
        self.on_control.assert_called_once_with(
            services.prepare_control_node, self.stack.log_dir, ['etcd'])

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


class StackTestCase(test.TestCase):
    """Base: a stack of the separate layout, run from node B, no guest.

    No database (``_db`` answers ''), no process started (``_cinder``
    is a mock: :attr:`cinder`); node B, where this process runs, reads
    no node's boot id.
    """

    def setUp(self):
        super().setUp()
        from tests.harness import services
        self.services = services
        self.stack = services.Stack(fake_topology(
            'separate', self.useFixture(fixtures.TempDir()).path))
        self.useFixture(fixtures.MockPatchObject(self.stack, '_db',
                                                 return_value=''))
        self.cinder = self.useFixture(fixtures.MockPatchObject(
            self.stack, '_cinder')).mock
        self.useFixture(fixtures.MockPatchObject(
            services.testbed, 'local_node', return_value='b'))


class ThinBackendTestCase(StackTestCase):
    """The stack's volume services with the thin backend, or without."""

    def test_thin_conf_only_when_on(self):
        self.stack.start_volume('b')
        self.assertEqual(('--config-file', '/etc/cinder/node-b.conf'),
                         tuple(self.cinder.call_args.kwargs['extra']))
        self.assertEqual(['node-b@dmclone'], self.stack.volume_hosts('b'))
        self.stack.thin = True
        self.stack.start_volume('b')
        self.assertEqual(('--config-file', '/etc/cinder/node-b.conf',
                          '--config-file', '/etc/cinder/thin.conf'),
                         tuple(self.cinder.call_args.kwargs['extra']))
        self.assertEqual(['node-b@dmclone', 'node-b@dmclone-thin'],
                         self.stack.volume_hosts('b'))

    def test_extra_files_after_thin_conf(self):
        restarted = self.useFixture(fixtures.MockPatchObject(
            self.stack, 'restart_volume')).mock
        self.useFixture(fixtures.MockPatchObject(
            self.stack, 'pools_ready', return_value=True))
        self.stack.use_thin(True, nodes=('b',),
                            extra=(self.services.BENCH_THIN_CONF,))
        self.stack.start_volume('b')
        self.assertEqual(('--config-file', '/etc/cinder/node-b.conf',
                          '--config-file', '/etc/cinder/thin.conf',
                          '--config-file', '/etc/cinder/bench-thin.conf'),
                         tuple(self.cinder.call_args.kwargs['extra']))
        self.assertEqual(1, restarted.call_count)
        # the same again: nothing to restart; without the extra file: one
        self.stack.use_thin(True, nodes=('b',),
                            extra=(self.services.BENCH_THIN_CONF,))
        self.assertEqual(1, restarted.call_count)
        self.stack.use_thin(True, nodes=('b',))
        self.assertEqual(2, restarted.call_count)
        self.assertEqual((), self.stack.thin_extra)
        self.stack.use_thin(False, nodes=('b',))
        self.stack.start_volume('b')
        self.assertEqual(('--config-file', '/etc/cinder/node-b.conf'),
                         tuple(self.cinder.call_args.kwargs['extra']))

    def test_the_bench_conf_turns_the_map_on_for_the_thin_backend(self):
        import configparser
        parser = configparser.ConfigParser(interpolation=None)
        conf_dir = os.path.join(os.path.dirname(__file__), '..', '..',
                                'tools', 'testbed', 'stack')
        parser.read([os.path.join(conf_dir, n) for n in (
            'cinder.conf', 'node-a.conf', 'thin.conf',
            self.services.BENCH_THIN_CONF)])
        thin = parser[self.services.THIN_BACKEND]
        self.assertEqual(('true', '1'), (thin['dmclone_thin_map'],
                                         thin['dmclone_monitor_interval']))
        self.assertNotIn('dmclone_thin_map', parser['dmclone'])
        self.assertEqual('1', parser['dmclone']['dmclone_monitor_interval'])
        plain = configparser.ConfigParser(interpolation=None)
        plain.read([os.path.join(conf_dir, n) for n in (
            'cinder.conf', 'node-a.conf', 'thin.conf')])
        self.assertNotIn('dmclone_thin_map', plain[
            self.services.THIN_BACKEND])

    def test_the_thin_map_conf_turns_the_map_on_and_nothing_else(self):
        import configparser
        conf_dir = os.path.join(os.path.dirname(__file__), '..', '..',
                                'tools', 'testbed', 'stack')
        own = configparser.ConfigParser(interpolation=None)
        own.read(os.path.join(conf_dir, self.services.THIN_MAP_CONF))
        self.assertEqual([self.services.THIN_BACKEND], own.sections())
        self.assertEqual({'dmclone_thin_map': 'true'},
                         dict(own[self.services.THIN_BACKEND]))
        parser = configparser.ConfigParser(interpolation=None)
        parser.read([os.path.join(conf_dir, n) for n in (
            'cinder.conf', 'node-b.conf', 'thin.conf',
            self.services.THIN_MAP_CONF)])
        self.assertEqual('true', parser[self.services.THIN_BACKEND][
            'dmclone_thin_map'])
        self.assertNotIn('dmclone_thin_map', parser['dmclone'])

    def test_log_lines_since_the_marks(self):
        os.makedirs(self.stack.log_dir, exist_ok=True)
        path = os.path.join(self.stack.log_dir, 'volume-a.log')
        with open(path, 'w') as f:
            f.write('an old needle\n')
        marks = self.stack.log_marks()
        with open(path, 'a') as f:
            f.write('other\na new needle\n')
        self.assertEqual(['a new needle'], self.stack.log_lines(
            marks, 'volume-a.log', 'needle'))
        self.assertEqual(['an old needle', 'a new needle'],
                         self.stack.log_lines({}, 'volume-a.log', 'needle'))
        self.assertEqual([], self.stack.log_lines(marks, 'volume-c.log',
                                                  'needle'))

    def test_pools_ready_per_backend(self):
        pools = [{'name': 'node-a@dmclone#dmclone'},
                 {'name': 'node-b@dmclone#dmclone'},
                 {'name': 'node-a@dmclone-thin#dmclone-thin'}]
        self.useFixture(fixtures.MockPatchObject(self.stack, 'pools',
                                                 return_value=pools))
        self.assertTrue(self.stack.pools_ready())
        self.assertTrue(self.stack.pools_ready('dmclone'))
        self.assertFalse(self.stack.pools_ready('dmclone-thin'))
        self.assertTrue(self.stack.pools_ready('dmclone-thin', nodes=('a',)))

    def test_the_stack_config_defines_the_thin_backend(self):
        import configparser
        conf_dir = os.path.join(os.path.dirname(__file__), '..', '..',
                                'tools', 'testbed', 'stack')

        def read(*names):
            parser = configparser.ConfigParser(interpolation=None)
            parser.read([os.path.join(conf_dir, n) for n in names])
            return parser
        thick = read('cinder.conf', 'node-a.conf')
        self.assertEqual('dmclone', thick['DEFAULT']['enabled_backends'])
        both = read('cinder.conf', 'node-a.conf', 'thin.conf')
        self.assertEqual('dmclone,dmclone-thin',
                         both['DEFAULT']['enabled_backends'])
        thin = both[self.services.THIN_BACKEND]
        self.assertEqual(('thin', 'dmc-a-thin', 'dmclone-thin'),
                         (thin['lvm_type'], thin['volume_group'],
                          thin['volume_backend_name']))
        self.assertEqual('default', both['dmclone']['lvm_type'])
        self.assertEqual('dmc-a', both['dmclone']['volume_group'])


class RebootedNodeServiceTestCase(StackTestCase):
    """A volume service whose node booted since it started is restarted.

    The service of another kernel's node is a local nodelink process
    that outlives its node's power-off by minutes: CI's run of 3bedf2b
    had test_moves' first scenario wait ten minutes for node A's
    service after test_kernels powered node A off and booted it.
    """

    def setUp(self):
        super().setUp()
        services = self.services
        self.useFixture(fixtures.MockPatchObject(
            services.testbed, 'answers', return_value=True))
        self.boot = {'a': 'boot-1', 'b': 'boot-b'}
        self.read = self.useFixture(fixtures.MockPatchObject(
            services.testbed, 'boot_id',
            side_effect=lambda node: self.boot[node])).mock
        self.restarted = self.useFixture(fixtures.MockPatchObject(
            self.stack, 'restart_volume')).mock
        self.ended = self.useFixture(fixtures.MockPatchObject(
            services, 'end_group', side_effect=self._end)).mock
        self.procs = {}
        for key in 'ab':
            proc = mock.Mock()
            proc.poll.return_value = None
            self.stack.procs['volume-' + key] = self.procs[key] = proc
            self.stack.start_volume(key)

    @staticmethod
    def _end(proc):
        proc.poll.return_value = -15

    def keep_running(self):
        self.services.keep_running(self.stack, mock.Mock())

    def test_only_another_kernels_node_is_asked(self):
        self.assertEqual([mock.call('a')], self.read.call_args_list)

    def test_a_service_of_the_same_boot_is_kept(self):
        self.assertFalse(self.stack.outlived_by('a'))
        self.keep_running()
        self.ended.assert_not_called()
        self.restarted.assert_not_called()

    def test_a_service_that_outlived_its_node_is_restarted(self):
        self.boot['a'] = 'boot-2'
        self.assertTrue(self.stack.outlived_by('a'))
        self.keep_running()
        self.ended.assert_called_once_with(self.procs['a'])
        self.restarted.assert_called_once_with('a')

    def test_a_dead_service_is_restarted_once(self):
        self.boot['a'] = 'boot-2'
        self.procs['a'].poll.return_value = 1
        self.keep_running()
        self.ended.assert_not_called()
        self.restarted.assert_called_once_with('a')


class ControlNodeTestCase(test.TestCase):
    """Where the stack's processes run: the control plane on its node.

    On separate kernels the servers, cinder-api and cinder-scheduler run
    on node "cp" (natively on the host, tools/testbed/control-plane);
    each volume service on its own node; on one kernel all of the control
    plane on node B, where the tests run.  Popen and the commands are
    mocks: what is checked is the argv each gets.
    """

    def stack(self, layout):
        from tests.harness import services
        stack = services.Stack(fake_topology(
            layout, self.useFixture(fixtures.TempDir()).path))
        self.useFixture(fixtures.MockPatchObject(
            services.testbed, 'local_node', return_value='b'))
        self.popen = self.useFixture(fixtures.MockPatchObject(
            services.subprocess, 'Popen')).mock
        self.run = self.useFixture(fixtures.MockPatchObject(
            services.testbed, 'run')).mock
        self.useFixture(fixtures.MockPatchObject(stack, '_db',
                                                 return_value=''))
        os.makedirs(stack.log_dir)
        return stack

    def spawned(self):
        """{first argument of the real command: the exec prefix}"""
        out = {}
        for call in self.popen.call_args_list:
            argv = call.args[0]
            on_cp = argv[:2] == ['/src/tools/testbed/guest/on-node', 'cp']
            command = argv[2:] if on_cp else argv
            out[command[0]] = 'cp' if on_cp else tuple(argv[:2])
        return out

    def test_separate_kernels_run_the_control_plane_on_its_node(self):
        from tests.harness import services
        stack = self.stack('separate')
        on_control = self.useFixture(fixtures.MockPatchObject(
            stack, '_on_control')).mock
        self.assertEqual('cp', stack.cp)
        stack._spawn_control_plane(services.CONTROL_PLANE)
        stack._cinder('cinder-api')
        stack._cinder('cinder-scheduler')
        stack.start_volume('b')
        # the servers' data prepared on their node, in one visit
        self.assertEqual([mock.call(services.prepare_control_node,
                                    stack.log_dir,
                                    ['mariadb', 'rabbitmq', 'etcd'])],
                         on_control.call_args_list)
        stack.start_rabbitmq()
        self.assertEqual(mock.call(services.prepare_rabbitmq),
                         on_control.call_args)
        where = self.spawned()
        for binary in ('/usr/sbin/mariadbd', 'rabbitmq-server', 'etcd',
                       'cinder-api', 'cinder-scheduler'):
            self.assertEqual('cp', where[binary], binary)
        # node B's volume service is this process's own child
        self.assertEqual(('cinder-volume', '--config-file'),
                         where['cinder-volume'])
        etcd = [c.args[0] for c in self.popen.call_args_list
                if 'etcd' in c.args[0]][0]
        self.assertIn('http://10.0.0.10:2379', etcd)

    def test_root_commands_go_to_the_control_node(self):
        import signal as signals
        stack = self.stack('separate')
        stack.create_database('cinder_ft', fresh=True)
        stack.sync_database()
        stack._kill_user('rabbitmq', signals.SIGKILL)
        self.assertEqual(['cp', 'cp', 'cp'],
                         [c.kwargs['node'] for c in self.run.call_args_list])
        self.assertEqual(['mysql', 'cinder-manage', 'pkill'],
                         [c.args[0][0] for c in self.run.call_args_list])

    def test_one_kernel_keeps_the_control_plane_on_node_b(self):
        stack = self.stack('one-kernel')
        self.assertEqual('b', stack.cp)
        stack._spawn_etcd()
        stack._cinder('cinder-api')
        self.assertEqual({'etcd': ('etcd', '--name'),
                          'cinder-api': ('cinder-api', '--config-file')},
                         self.spawned())
        done = []
        self.assertEqual('ok', stack._on_control(
            lambda: done.append(1) or 'ok'))
        self.assertEqual([1], done)

    def test_a_worker_on_the_control_node_runs_its_calls(self):
        from tests.harness import services
        stack = self.stack('separate')
        worker = self.useFixture(fixtures.MockPatchObject(
            services.workers, 'NodeProcess')).mock
        node = worker.return_value.__enter__.return_value
        node.call.return_value = 'done'
        self.assertEqual('done', stack._on_control(services.prepare_mariadb))
        worker.assert_called_once_with('cp')
        node.call.assert_called_once_with(services.prepare_mariadb)

    def test_the_services_reach_the_control_plane_by_name(self):
        import configparser
        from tests.harness import services
        conf_dir = os.path.join(os.path.dirname(__file__), '..', '..',
                                'tools', 'testbed', 'stack')
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(os.path.join(conf_dir, 'cinder.conf'))
        for url in (parser['DEFAULT']['transport_url'],
                    parser['database']['connection'],
                    parser['coordination']['backend_url']):
            self.assertIn('@controller' if '@' in url else '//controller:',
                          url)
        self.assertEqual('0.0.0.0', parser['DEFAULT']['osapi_volume_listen'])
        mariadb = configparser.ConfigParser(interpolation=None,
                                            allow_no_value=True)
        mariadb.read(os.path.join(conf_dir, 'mariadb.cnf'))
        self.assertEqual('0.0.0.0', mariadb['mysqld']['bind-address'])
        with open(os.path.join(conf_dir, 'rabbitmq.config')) as f:
            self.assertIn('{tcp_listeners, [{"0.0.0.0", 5672}]}', f.read())
        self.assertEqual('http://controller:8776/v3', services.API)


class TopologyControlTestCase(test.TestCase):
    """The control plane's node, as the topology file names it."""

    def topology(self, raw):
        from tests.harness import testbed
        path = os.path.join(self.useFixture(fixtures.TempDir()).path, 't')
        with open(path, 'w') as f:
            json.dump(raw, f)
        self.useFixture(fixtures.MockPatchObject(testbed, 'TOPOLOGY_PATH',
                                                 path))
        self.useFixture(fixtures.MonkeyPatch(
            'tests.harness.testbed._TOPOLOGY', None))
        return testbed.topology()

    @staticmethod
    def raw(**extra):
        node = {'name': 'node-x', 'hostname': 'nodex', 'netns': None,
                'ip': '10.0.0.9', 'exec': [], 'vg': 'dmc-x',
                'initiator_iqn': None}
        raw = {'lvm_conf': 'l', 'lvm_system_dir': 'd', 'python': 'p',
               'src': '/src', 'artifacts_dir': 'a', 'iscsi_port': 3260,
               'nodes': {'a': dict(node, name='node-a'),
                         'b': dict(node, name='node-b')}}
        raw.update(extra)
        return raw

    def test_its_own_node_on_separate_kernels(self):
        topo = self.topology(self.raw(layout='separate', control_plane={
            'key': 'cp', 'name': 'controller', 'hostname': 'nodecp',
            'ip': '10.0.0.10', 'exec': ['on-node', 'cp']}))
        self.assertIs(topo.control, topo.node('cp'))
        self.assertEqual(('cp', '10.0.0.10', ('on-node', 'cp')),
                         (topo.control.key, topo.control.ip,
                          topo.control.exec_prefix))
        # never one of the storage nodes
        self.assertNotIn(topo.control, topo.nodes.values())
        self.assertEqual('node-a', topo.node('node-a').name)

    def test_node_b_without_one(self):
        topo = self.topology(self.raw())
        self.assertIs(topo.b, topo.control)


@unittest.skipUnless(os.geteuid() == 0 and shutil.which('uml_switch')
                     and shutil.which('unshare'),
                     'the control-plane node needs root, uml_switch and '
                     'unshare')
class ControlPlaneNodeTestCase(test.TestCase):
    """tools/testbed/control-plane for real, over this host's own root.

    (The testbed gives it the guests' root filesystem; any Debian root
    with python3 serves here.)  It must answer on the segment as node
    "cp", see the run's tree and directory where a guest does, stay off
    the host's interfaces and leave no process or mount behind.
    """

    def setUp(self):
        super().setUp()
        self.runner = load_runner()
        self.run_dir = self.useFixture(fixtures.TempDir()).path
        self.switch, _ctl = self.runner.start_switch(self.run_dir)
        self.addCleanup(self.runner.kill_group, self.switch, hard=True)
        self.segment = '/proc/%d/ns/net' % self.switch.pid

    def on_cp(self, script):
        return subprocess.run(
            self.runner.joining(self.segment, [
                sys.executable, NODELINK, 'exec', self.runner.CONTROL_IP,
                '7001', 'sh', '-c', script]),
            capture_output=True, text=True, cwd='/', timeout=60)

    def test_it_serves_on_the_segment_and_goes_with_its_group(self):
        with open(os.path.join(self.run_dir, 'mark'), 'w') as f:
            f.write('run dir\n')
        cp = self.runner.start_control_plane('/', self.run_dir,
                                             self.segment)
        self.addCleanup(self.runner.kill_group, cp, hard=True)
        deadline = time.monotonic() + 120
        while True:
            proc = self.on_cp(
                'uname -n; getent hosts controller; cat /testbed/run/mark; '
                'test -f /src/tools/testbed/control-plane && echo tree; '
                'touch /src/x 2>/dev/null || echo read-only; '
                'readlink /proc/self/ns/pid; '
                'test -e /proc/1/root%s/mark || echo no-way-back; '
                'test -w /proc/sysrq-trigger || echo sysrq-read-only; '
                'grep -q " /proc/sys ro," /proc/self/mountinfo '
                '&& echo sysctl-read-only' % self.run_dir)
            if proc.returncode == 0:
                break
            log = os.path.join(self.run_dir, 'control-plane.log')
            self.assertLess(time.monotonic(), deadline, '%s\n%s' % (
                proc.stderr, open(log).read() if os.path.exists(log)
                else ''))
            time.sleep(0.5)
        lines = proc.stdout.split('\n')
        self.assertEqual('nodecp', lines[0])
        self.assertEqual(['10.0.0.10', 'nodecp', 'controller'],
                         lines[1].split())
        self.assertEqual(['run dir', 'tree', 'read-only'], lines[2:5])
        # a PID namespace of its own, no path back to the host's root,
        # the kernel's knobs read-only
        container_pids = lines[5]
        self.assertNotEqual(os.readlink('/proc/self/ns/pid'),
                            container_pids)
        self.assertEqual(['no-way-back', 'sysrq-read-only',
                          'sysctl-read-only'], lines[6:9])
        host_links = subprocess.run(['ip', '-o', 'link'], capture_output=True,
                                    text=True, check=True).stdout
        self.assertNotIn(self.runner.CONTROL_TAP + ':', host_links)
        self.assertNotIn('nodecp', open('/etc/hosts').read())
        self.runner.kill_group(cp, hard=True)
        self._assert_emptied(container_pids)
        with open('/proc/self/mountinfo') as f:
            self.assertNotIn(self.run_dir, f.read())

    def test_a_sigterm_ends_it_too(self):
        cp = self.runner.start_control_plane('/', self.run_dir,
                                             self.segment)
        self.addCleanup(self.runner.kill_group, cp, hard=True)
        deadline = time.monotonic() + 120
        while True:
            proc = self.on_cp('readlink /proc/self/ns/pid')
            if proc.returncode == 0:
                break
            self.assertLess(time.monotonic(), deadline, proc.stderr)
            time.sleep(0.5)
        os.killpg(cp.pid, signal.SIGTERM)
        # (PID 1 of a namespace ignores a signal it has no handler for)
        cp.wait(timeout=30)
        self._assert_emptied(proc.stdout.strip())

    def _assert_emptied(self, pid_ns):
        """Every process of ``pid_ns`` goes.

        (The kernel kills them once its PID 1 is gone, not at once.)
        """
        deadline = time.monotonic() + 60
        while self._in_namespace(pid_ns):
            self.assertLess(time.monotonic(), deadline,
                            self._in_namespace(pid_ns))
            time.sleep(0.2)

    @staticmethod
    def _in_namespace(pid_ns):
        """The host's processes in PID namespace ``pid_ns`` (its link)."""
        found = []
        for pid in os.listdir('/proc'):
            if not pid.isdigit():
                continue
            try:
                if os.readlink('/proc/%s/ns/pid' % pid) == pid_ns:
                    found.append(pid)
            except OSError:
                pass
        return found


class CompileTreeTestCase(test.TestCase):
    """The runner writes the tree's bytecode before the guests boot."""

    def test_each_package_gets_its_bytecode(self):
        runner = load_runner()
        tree = self.useFixture(fixtures.TempDir()).path
        for package in runner.COMPILED:
            os.makedirs(os.path.join(tree, package, 'sub'))
            for path in ('__init__.py', 'sub/__init__.py', 'sub/m.py'):
                with open(os.path.join(tree, package, path), 'w') as f:
                    f.write('X = 1\n')
        self.useFixture(fixtures.MockPatchObject(runner, 'TREE', tree))
        self.useFixture(fixtures.MockPatchObject(runner, 'say'))
        runner.compile_tree()
        tag = sys.implementation.cache_tag
        for package in runner.COMPILED:
            self.assertTrue(os.path.exists(os.path.join(
                tree, package, 'sub', '__pycache__', 'm.%s.pyc' % tag)))


class DeadControlPlaneTestCase(StackTestCase):
    """A control-plane process that died is started again.

    keep_running does, over its data, before the next test: each dies
    with its node link from node B.
    """

    def setUp(self):
        super().setUp()
        self.useFixture(fixtures.MockPatchObject(
            self.services.testbed, 'answers', return_value=True))
        self.useFixture(fixtures.MockPatchObject(
            self.stack, 'restart_volume'))
        for name in ('mariadb', 'rabbitmq', 'etcd', 'cinder-api',
                     'cinder-scheduler', 'volume-a', 'volume-b'):
            proc = mock.Mock()
            proc.poll.return_value = None
            self.stack.procs[name] = proc

    def again(self):
        return self.useFixture(fixtures.MockPatchObject(
            self.stack, 'start_again')).mock

    def test_only_the_dead_ones_in_their_order(self):
        again = self.again()
        for name in ('cinder-api', 'mariadb'):
            self.stack.procs[name].poll.return_value = -9
        self.services.keep_running(self.stack, mock.Mock())
        self.assertEqual([mock.call('mariadb'), mock.call('cinder-api')],
                         again.call_args_list)

    def test_none_that_was_never_started(self):
        again = self.again()
        del self.stack.procs['rabbitmq']
        self.services.keep_running(self.stack, mock.Mock())
        again.assert_not_called()

    def test_mariadb_starts_over_the_same_data(self):
        spawn = self.useFixture(fixtures.MockPatchObject(
            self.stack, '_spawn')).mock
        self.useFixture(fixtures.MockPatchObject(self.stack, '_wait'))
        fresh = self.useFixture(fixtures.MockPatchObject(
            self.services, 'prepare_mariadb')).mock
        self.stack.start_again('mariadb')
        spawn.assert_called_once_with(
            'mariadb', ['/usr/sbin/mariadbd', '--user=mysql'], 'cp')
        fresh.assert_not_called()
        self.assertRaises(self.services.StackError, self.stack.start_again,
                          'volume-a')
