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

"""RabbitMQ and MariaDB restart while a volume moves (issue 18, scenario 7).

The full stack of test_moves.py, on separate kernels.  The broker or the
database is killed (its whole process group, as a crash) and started
again, once while a volume hydrates on node B from node A and once in the
middle of the attach that moves it, while node B's service builds the
clone (held there with SIGSTOP once node B has made the volume's LVs, so
that the restart lands inside the move every time).

A clean outcome is one of two: the move completes (finalized, every MiB
as written, node A keeps nothing), or it fails and the volume is back on
node A with every byte, node B keeps nothing and a retried attach moves
it.  No cinder-volume is restarted: oslo.messaging and oslo.db reconnect,
the driver's monitor goes on, and the services' logs hold no error that
is not the outage itself (or, when the move failed, about that move).
"""

import logging
import threading

import pytest

from tests.harness import api
from tests.harness import steps
from tests.harness import testbed

pytestmark = pytest.mark.layouts('separate')

# The stack and the cloud: conftest.py's, one per session, with its
# clean-up of nodes and volume services (services_running).

LOG = logging.getLogger('control-plane')
MiB = testbed.MiB
HOSTS = ('node-a@dmclone', 'node-b@dmclone', 'controller')

#: What an error logged during an outage may be about (lower case).
BROKER_DOWN = ('amqp', 'rabbit', 'connection refused', 'connection reset',
               'econnrefused', 'broken pipe', 'socket closed',
               'connectionforced', 'connection_forced', 'messagingtimeout',
               'timed out waiting for a reply', 'unreachable')
DATABASE_DOWN = ('dbconnectionerror', "can't connect to mysql",
                 'lost connection to mysql', 'mysql server has gone away',
                 'model server went away', '(2003', '(2006', '(2013',
                 # cinder.service logs its reconnection at ERROR level
                 'recovered model server connection')


@pytest.fixture(autouse=True)
def control_plane_running(request, services_running):
    """Whatever a scenario did, the control plane runs after it.

    (Torn down before services_running, which needs the database.)
    """
    yield
    if 'stack' not in request.fixturenames:
        return
    s = request.getfixturevalue('stack')
    if s.alive('volume-b'):
        s.resume_volume('b')
    if not s.alive('mariadb'):
        LOG.warning('MariaDB is down after the test: starting it')
        s.restart_mariadb()
    if not s.alive('rabbitmq'):
        LOG.warning('RabbitMQ is down after the test: starting it')
        s.restart_rabbitmq()


def writes(seed):
    """What a scenario's volume holds: its head, and far in (at 900 MiB)."""
    return [(seed, 0, 8 * MiB), (seed + 1, 900 * MiB, 4 * MiB)]


def volume_pids(stack):
    return {key: stack.procs['volume-' + key].pid for key in ('a', 'b')}


def check_services_carried_on(stack, pids, since):
    """The same cinder-volume processes, all services reporting again."""
    assert volume_pids(stack) == pids
    assert all(stack.alive('volume-' + key) for key in ('a', 'b'))
    testbed.wait_until(lambda: stack.services_up(HOSTS, since), 300,
                       'every service reporting since %s' % since,
                       interval=2)


def check_logs(stack, marks, expected, volume_id=None):
    """No error since ``marks`` but the outage's (and the failed move's).

    ``volume_id``: errors naming the volume are the failed move's own
    (its attach failed while the control plane was down); logged, and
    accepted.
    """
    unexpected = []
    for name, lines in stack.error_records(marks):
        text = '\n'.join(lines)
        if any(marker in text.lower() for marker in expected):
            continue
        if volume_id and volume_id in text:
            LOG.info('error of the failed move (%s): %s', name, lines[0])
            continue
        unexpected.append('%s: %s' % (name, '\n'.join(lines[:20])))
    assert not unexpected, ('errors not caused by the outage:\n'
                            + '\n\n'.join(unexpected))


def nothing_on_b(cloud, volume_id):
    return steps.kept_on(cloud, 'b', volume_id) == []


def check_moved(cloud, vol, image, att=None):
    """The move completed: finalized, every byte, nothing left on A.

    ``att``: node B's attachment that moved it; without one, an attach
    on node B moves it now (the retry after a failed move).
    """
    if att is None:
        att = steps.attached_on(cloud, vol.id, 'b')
    assert cloud.node_of(vol.id) == 'b'
    steps.wait_finalized(cloud, vol.id)
    image.check(cloud, att)
    assert steps.kept_on(cloud, 'a', vol.id) == []
    assert steps.kept_on(cloud, 'b', vol.id) == ['LV volume-%s' % vol.id]
    cloud.detach(att)
    v = cloud.get(vol.id)
    assert (v.status, v.availability_zone) == ('available', 'az-b')


def check_failed_cleanly(cloud, vol, image):
    """Back on node A with every byte, nothing on B; a retry moves it."""
    # Nova's side: an attach that failed while the database was down
    # could not delete the attachment it had reserved.
    for leftover in cloud.c.attachments.list(
            search_opts={'volume_id': vol.id}):
        LOG.info('deleting the attachment of the failed attach %s',
                 leftover.id)
        cloud.c.attachments.delete(leftover.id)
    cloud.wait_status(vol.id, 'available')
    assert cloud.node_of(vol.id) == 'a'
    # Nothing moving (an 'aborted' record is inert: the volume is A's)
    # once node A's monitor ticked with the database back: node A saw
    # its attempt fail, so it needs no timeout to give the move up.
    # (Its export gone first, node B's logout waits out open-iscsi's
    # replacement timeout: two minutes.)
    testbed.wait_until(
        lambda: cloud.transfer_state(vol.id).get('dmclone_state') in (
            None, 'aborted'), 300, 'the failed move of %s given up' % vol.id,
        interval=2, diagnostics=lambda: cloud.transfer_state(vol.id))
    testbed.wait_until(lambda: nothing_on_b(cloud, vol.id), 300,
                       'node B keeps nothing of %s' % vol.id, interval=5,
                       diagnostics=lambda: steps.kept_on(
                           cloud, 'b', vol.id))
    att = steps.attached_on(cloud, vol.id, 'a')
    image.check(cloud, att)
    cloud.detach(att)
    LOG.info('retrying the attach on node B')
    check_moved(cloud, vol, image)


# -- a restart while the volume hydrates ---------------------------------

def restart_while_hydrating(cloud, stack, seed, restart, expected):
    vt = steps.slow_hydration_type(cloud)
    vol, image = steps.seeded_on(cloud, 'a', writes(seed), vt.id)
    try:
        pids = volume_pids(stack)
        att = steps.attached_on(cloud, vol.id, 'b')
        # node B's own write, where the copy (front to back) has not been
        image.write(cloud, att, seed + 2, 960 * MiB, 4 * MiB)
        before = steps.still_hydrating(cloud, att, 'before the restart')
        marks = stack.log_marks()
        LOG.info('restart at %.1f%% hydrated', 100 * before)
        restart()
        since = stack.db_now()
        published = int(cloud.transfer_state(vol.id).get(
            'dmclone_hydrated_regions') or 0)
        # The monitor goes on: it publishes progress again (a database
        # write, after the restart).
        testbed.wait_until(
            lambda: int(cloud.transfer_state(vol.id).get(
                'dmclone_hydrated_regions') or 0) > published,
            300, 'progress of %s published after the restart' % vol.id,
            interval=2)
        # The rest of the copy at the driver's default pace (what a
        # retype to a type without dmclone: specs would do).
        handle = att.path.rsplit('/', 1)[-1]
        for name, value in (('hydration_threshold', 64),
                            ('hydration_batch_size', 16)):
            testbed.run(['dmsetup', 'message', handle, '0', name, value],
                        check=False)
        check_moved(cloud, vol, image, att)
        check_services_carried_on(stack, pids, since)
        check_logs(stack, marks, expected)
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_rabbitmq_restarts_while_hydrating(cloud, stack):
    """The broker dies and comes back while node B copies from node A.

    The monitor needs no broker to copy; the finalization's retire of
    node A's copy is a call to node A after the restart.
    """
    def restart():
        stack.restart_rabbitmq()
        stack.wait_rpc_servers(['node-a', 'node-b'])
    restart_while_hydrating(cloud, stack, 111, restart, BROKER_DOWN)


@pytest.mark.extended
def test_mariadb_restarts_while_hydrating(cloud, stack):
    """The database dies and comes back while node B copies from node A.

    The monitor's ticks fail to read and publish meanwhile (logged), and
    carry on once oslo.db has reconnected.
    """
    restart_while_hydrating(cloud, stack, 121, stack.restart_mariadb,
                            DATABASE_DOWN)


# -- a restart inside the attach that moves the volume --------------------

def restart_during_move(cloud, stack, seed, outage, expected):
    """Attach on node B; ``outage(resume)`` while node B builds the clone.

    Node B's service is frozen once it has made the volume's LVs (it is
    inside the prepare, node A waits for its answer, the API for node
    A's): ``outage`` restarts the broker or the database and calls
    ``resume()`` to let node B go on, at the point it chooses.
    """
    vol, image = steps.seeded_on(cloud, 'a', writes(seed))
    result = {}

    def attach():
        try:
            result['att'] = cloud.attach(vol.id, 'b')
        except Exception as exc:
            result['error'] = exc
    try:
        pids = volume_pids(stack)
        api.load_brick()      # (from the main thread first)
        marks = stack.log_marks()
        thread = threading.Thread(target=attach, daemon=True)
        thread.start()
        testbed.wait_until(
            lambda: not thread.is_alive() or not nothing_on_b(cloud,
                                                              vol.id),
            600, 'node B building the clone of %s' % vol.id, interval=0.5)
        paused = [False]

        def resume():
            if paused[0]:
                stack.resume_volume('b')
                paused[0] = False
        try:
            stack.pause_volume('b')
            paused[0] = True
            state = cloud.transfer_state(vol.id).get('dmclone_state')
            assert thread.is_alive() and state == 'preparing', (
                'the hold came too late: the attach ended (%s) or the '
                'move is %s already' % (result, state))
            outage(resume, thread)
        finally:
            resume()
        thread.join(timeout=900)
        assert not thread.is_alive(), 'the attach never returned'
        since = stack.db_now()
        stack.wait_rpc_servers(['node-a', 'node-b'])
        LOG.info('attach on node B after the restart: %s', result)
        if cloud.node_of(vol.id) == 'b':
            check_moved(cloud, vol, image, result.get('att'))
            check_logs(stack, marks, expected)
        else:
            check_failed_cleanly(cloud, vol, image)
            check_logs(stack, marks, expected, volume_id=vol.id)
        check_services_carried_on(stack, pids, since)
    finally:
        cloud.delete(vol.id)


# Extended: CI has no room for its minutes (tox -e
# functional-separate-extended runs it).
@pytest.mark.extended
def test_rabbitmq_restarts_during_the_move(cloud, stack):
    """The broker dies while node A waits for node B's prepare.

    Node B had taken the request; its answer goes out once the broker is
    back and node A consumes again (its reply queue declared anew).
    """
    def outage(resume, thread):
        stack.restart_rabbitmq()
        stack.wait_rpc_servers(['node-a'])
        resume()
    restart_during_move(cloud, stack, 131, outage, BROKER_DOWN)


# Extended: CI has no room for its minutes (tox -e
# functional-separate-extended runs it).
@pytest.mark.extended
def test_mariadb_restarts_during_the_move(cloud, stack):
    """The database dies as node B finishes the clone node A waits for.

    Node B goes on building while the database is down; what follows
    (node B's last check, node A's record of the outcome or of the
    failure, the API's) meets the outage.  The database comes back once
    the attach has returned (or after two minutes).
    """
    def outage(resume, thread):
        stack.stop_mariadb()
        resume()
        thread.join(timeout=120)
        stack.restart_mariadb()
    restart_during_move(cloud, stack, 141, outage, DATABASE_DOWN)
