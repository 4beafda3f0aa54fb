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

"""Volumes moving in every direction between nodes with their own kernels.

The full stack of test_fullstack.py, on the separate-kernel testbed
(``tox -e functional-separate``): node A's cinder-volume, iscsid and LIO
run in node A's own guest kernel, so node A is an initiator too and a
volume can move back.  Every byte is checked at every hop: the volume's
first GiB as 1 MiB blocks, against what was written at each hop; and
after each finalization the old node keeps nothing of the volume.
"""

import errno
import logging
import time

import pytest

from tests.harness import api
from tests.harness import services
from tests.harness import steps
from tests.harness import testbed

pytestmark = pytest.mark.layouts('separate')

# The stack and the cloud: conftest.py's, one per session.

LOG = logging.getLogger('moves')
MiB = testbed.MiB
GiB = 1024 * MiB


# Extended since 2026-11-28, with the two after it: on the machine CI ran
# on 2026-11-27 the full stack's start alone took more than 15 minutes
# (``cinder-manage db sync`` 580 s on node B) and the CI tier did not
# end in 90 minutes; the CI tier keeps the kernel-level tests
# (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_volume_moves_there_back_and_there_again(cloud, topo):
    """Ping-pong: A to B, back to A, to B again; every byte at every hop."""
    vol = cloud.create(size=1, az='az-a')
    try:
        att = steps.attached_on(cloud, vol.id, 'a')
        image = steps.Image(cloud.on_node('a', api.block_digests, att.path,
                                          GiB, steps.BLOCK))
        image.write(cloud, att, 61, 0, 8 * MiB)
        image.check(cloud, att)
        cloud.detach(att)

        for hop, (old, new) in enumerate((('a', 'b'), ('b', 'a'),
                                          ('a', 'b')), 1):
            LOG.info('hop %d: %s -> %s', hop, old.upper(), new.upper())
            att = steps.attached_on(cloud, vol.id, new)
            # Read through the clone (from the old node, unless copied
            # already), and written near the end, where the copy (front
            # to back) has most likely not been yet: the copy must not
            # overwrite it.
            assert cloud.sha256(att, 0, 8 * MiB) == testbed.sha256(
                testbed.pattern(61, 8 * MiB))
            image.write(cloud, att, 61 + hop, GiB - hop * 8 * MiB, 4 * MiB)
            steps.wait_finalized(cloud, vol.id)
            table = cloud.on_node(new, testbed.dm_table,
                                  att.path.rsplit('/', 1)[-1])
            assert ' linear ' in ' %s ' % table, table
            image.check(cloud, att)
            # the old node keeps nothing; the new one the volume's LV only
            assert steps.kept_on(cloud, old, vol.id) == []
            assert steps.kept_on(cloud, new, vol.id) == [
                'LV volume-%s' % vol.id]
            cloud.detach(att)
            v = cloud.get(vol.id)
            assert (v.status, cloud.node_of(vol.id),
                    v.availability_zone) == ('available', new, 'az-' + new)
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_live_migration_there_and_back_and_a_rollback(cloud):
    """Live migration A to B committed, B to A committed, A to B failed.

    Nova's flow each time: the destination's attachment for the same
    instance (the volume moves, hydration off), the instance writes on
    the source until the switch-over, then Nova deletes the source's
    attachment (commit) or, when the migration fails, the destination's
    (rollback: the source keeps every write, the destination nothing).
    (:func:`steps.live_migrations`; test_thin.py runs it on thin LVs.)
    """
    vol = cloud.create(size=1, az='az-a')
    try:
        steps.live_migrations(cloud, vol.id)
    finally:
        cloud.delete(vol.id)


@pytest.mark.extended
def test_source_powered_off_while_hydrating(cloud, stack):
    """Node A loses power while node B still copies from it.

    When node A boots, its volume service starts as it would at boot and
    must export again what node B still needs (Cinder's start asks it for
    nothing: the volume's record names node B); node B's session logs in
    again and the copy completes without an operator.  Every byte is
    checked, the writes node B made while node A was down included.
    """
    vt = steps.slow_hydration_type(cloud)
    vol, image = steps.seeded_on(
        cloud, 'a', [(81, 0, 8 * MiB), (82, 900 * MiB, 4 * MiB)], vt.id)
    try:
        att = steps.attached_on(cloud, vol.id, 'b')
        before = steps.still_hydrating(cloud, att,
                                       'before node A was powered off')
        steps.power_off(stack, cloud, 'a')
        LOG.info('node A powered off at %.1f%% hydrated', 100 * before)
        # Node B keeps working on what is local (its own writes), here
        # in a region not copied yet (the copy goes front to back).
        image.write(cloud, att, 83, 960 * MiB, 4 * MiB)

        stack.boot('a')
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        image.check(cloud, att)
        assert steps.kept_on(cloud, 'a', vol.id) == []
        cloud.detach(att)
    finally:
        cloud.delete(vol.id)


def read_error(path, offset, length):
    """The errno of an O_DIRECT read there, None when it reads."""
    try:
        testbed.read_direct(path, offset, length)
    except OSError as exc:
        return exc.errno
    return None


@pytest.mark.extended
def test_source_down_past_the_replacement_timeout(cloud, stack):
    """Node A stays down longer than open-iscsi's replacement timeout.

    Then the kernel gives up on the I/O it queued for node A: node B's
    reads of regions not copied yet fail (EIO), while what node B holds
    (copied, or written there) reads.  When node A is back, its service
    exports again, node B's initiator (which never stops trying) logs in
    again, those reads work and the copy finishes by itself.
    """
    vt = steps.slow_hydration_type(cloud)
    vol, image = steps.seeded_on(
        cloud, 'a', [(111, 0, 8 * MiB), (112, 800 * MiB, 4 * MiB)], vt.id)
    try:
        att = steps.attached_on(cloud, vol.id, 'b')
        steps.still_hydrating(cloud, att, 'before node A was powered off')
        steps.power_off(stack, cloud, 'a')
        t0 = time.monotonic()
        image.write(cloud, att, 113, 960 * MiB, 4 * MiB)
        # blocks until the replacement timeout (120 s) has passed
        assert read_error(att.path, 800 * MiB, MiB) == errno.EIO
        LOG.info('read of an uncopied region failed %.0f s after the '
                 'power-off', time.monotonic() - t0)
        assert read_error(att.path, 960 * MiB, 4 * MiB) is None
        assert read_error(att.path, 0, MiB) is None

        stack.boot('a')
        testbed.wait_until(
            lambda: read_error(att.path, 800 * MiB, MiB) is None, 600,
            'node B reading node A\'s regions again')
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        image.check(cloud, att)
        assert steps.kept_on(cloud, 'a', vol.id) == []
        cloud.detach(att)
    finally:
        cloud.delete(vol.id)


# Extended since 2026-11-26: CI's machine ran the CI tier at half the
# speed it was sized on (doc/source/contributor/testing.rst).
@pytest.mark.extended
def test_destination_powered_off_while_hydrating(cloud, stack):
    """Node A loses power while it copies a volume in from node B.

    The instance on node A wrote (and flushed) before the power loss.
    When node A boots, its service rebuilds the clone from the metadata
    LV (Cinder's start asks it to export the in-use volume again), the
    copy from node B resumes, and every byte is there: node B's data and
    node A's flushed writes, none overwritten by the copy.
    """
    vt = steps.slow_hydration_type(cloud)
    vol, image = steps.seeded_on(
        cloud, 'b', [(91, 0, 8 * MiB), (92, 900 * MiB, 4 * MiB)], vt.id)
    try:
        att = steps.attached_on(cloud, vol.id, 'a')
        before = steps.still_hydrating(cloud, att,
                                       'before node A was powered off')
        # flushed, in a region not copied yet (the copy goes front to back)
        image.write(cloud, att, 93, 960 * MiB, 4 * MiB)
        steps.power_off(stack, cloud, 'a')
        LOG.info('node A powered off at %.1f%% hydrated', 100 * before)

        stack.boot('a')
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        assert cloud.node_of(vol.id) == 'a'
        image.check(cloud, att)
        assert steps.kept_on(cloud, 'b', vol.id) == []
        assert steps.kept_on(cloud, 'a', vol.id) == ['LV volume-%s' % vol.id]
        cloud.detach(att)
    finally:
        cloud.delete(vol.id)


@pytest.fixture
def node_c(stack, cloud):
    """A third node for the test: booted, its volume service reporting.

    Its kernel is checked as the others are (nothing of the test left on
    it), then it is powered off, so the other scenarios do not share two
    CPUs with its idle service.
    """
    stack.boot('c')
    baseline = testbed.snapshot(kernels=('c',))
    try:
        yield 'c'
        problems = testbed.leaks(baseline)
        if problems:
            testbed.force_cleanup(baseline)
            pytest.fail('test left resources on node C (now force-cleaned):'
                        '\n  ' + '\n  '.join(problems), pytrace=False)
    finally:
        cloud.forget_node('c')
        stack.power_off('c')


@pytest.mark.extended
def test_volume_moves_on_to_a_third_node(cloud, node_c):
    """Chain: A to B, then B to C right after it finalized.

    While A to B still hydrates, the instance's live migration on to C
    is refused clearly (a volume copies from one source at a time) and
    changes nothing.  A retype to the default type then gives the live
    clone the default (faster) hydration.  Once finalized on B, the
    volume moves on to C with every byte, and neither A nor B keeps
    anything of it.
    """
    vt = steps.slow_hydration_type(cloud)
    vol, image = steps.seeded_on(cloud, 'a', [(101, 0, 8 * MiB)], vt.id)
    try:
        att = steps.attached_on(cloud, vol.id, 'b')
        assert cloud.transfer_state(vol.id)['dmclone_state'] == 'hydrating'
        refusal = cloud.attach_refused(vol.id, 'c', att.instance)
        assert 'is moving from' in refusal, refusal
        # refused while it was hydrating (not after), and nothing changed
        assert steps.hydrated_fraction(cloud, att) < 1
        assert cloud.transfer_state(vol.id)['dmclone_state'] == 'hydrating'
        assert [a.id for a in cloud.c.attachments.list(
            search_opts={'volume_id': vol.id})] == [att.id]
        assert (cloud.get(vol.id).status, cloud.node_of(vol.id)) == (
            'in-use', 'b')
        assert steps.kept_on(cloud, 'c', vol.id) == []
        image.write(cloud, att, 102, GiB - 8 * MiB, 4 * MiB)
        cloud.retype(vol.id, services.VOLUME_TYPE)
        assert cloud.transfer_state(vol.id)['dmclone_state'] == 'hydrating'
        status = cloud.on_node('b', testbed.dm_status,
                               att.path.rsplit('/', 1)[-1])
        assert 'hydration_threshold 64 hydration_batch_size 16' in status, (
            status)
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        image.check(cloud, att)
        assert steps.kept_on(cloud, 'a', vol.id) == []
        cloud.detach(att)

        LOG.info('B -> C right after the move to B finalized')
        att = steps.attached_on(cloud, vol.id, 'c')
        assert cloud.sha256(att, 0, 8 * MiB) == testbed.sha256(
            testbed.pattern(101, 8 * MiB))
        image.write(cloud, att, 103, 512 * MiB, 4 * MiB)
        steps.wait_finalized(cloud, vol.id, timeout=1800)
        image.check(cloud, att)
        assert steps.kept_on(cloud, 'b', vol.id) == []
        assert steps.kept_on(cloud, 'c', vol.id) == ['LV volume-%s' % vol.id]
        cloud.detach(att)
        v = cloud.get(vol.id)
        assert (v.status, cloud.node_of(vol.id), v.availability_zone) == (
            'available', 'c', 'az-c')
    finally:
        cloud.delete(vol.id)
