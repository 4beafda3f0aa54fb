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

"""Thin pools: the lvs report parsed, and what a move into a pool needs."""

import math

import ddt

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import exception
from cinder_dmclone import thin

GIB = 1024 ** 3
MIB = 1024 ** 2
CHUNK = 64 * 1024

#: A 100 GiB pool, 40% of its data and 10% of its 100 MiB of metadata in
#: use; two thin volumes of 50 and 30 GiB (one a quarter allocated), a
#: thick metadata LV of a clone, and an LV of another pool.
REPORT = '\n'.join([
    '  cinder-volumes-pool|%d|40.00|10.00|%d|%d|' % (
        100 * GIB, 100 * MIB, CHUNK),
    '  volume-1|%d|25.00|||0|cinder-volumes-pool' % (50 * GIB),
    '  volume-2|%d|100.00|||0|cinder-volumes-pool' % (30 * GIB),
    '  volume-2-dmcmeta|%d|||||' % (8 * MIB),
    '  other|%d|1.00|||0|other-pool' % (500 * GIB),
    '',
])


def make_pool(**overrides):
    values = dict(name='p', size=100 * GIB, data_used=40 * GIB,
                  metadata_size=100 * MIB, metadata_used=10 * MIB,
                  chunk_size=CHUNK, provisioned=80 * GIB)
    values.update(overrides)
    return thin.Pool(**values)


@ddt.ddt
class ParseTestCase(test.TestCase):

    def test_report(self):
        lvs = thin.parse_lvs(REPORT)
        self.assertEqual(['cinder-volumes-pool', 'other', 'volume-1',
                          'volume-2', 'volume-2-dmcmeta'], sorted(lvs))
        vol = lvs['volume-1']
        self.assertEqual((50 * GIB, 25.0, 'cinder-volumes-pool'),
                         (vol.size, vol.data_percent, vol.pool))
        # A thin LV's allocated data: its data_percent of its size.
        self.assertEqual(12.5 * GIB, vol.allocated)
        meta = lvs['volume-2-dmcmeta']
        self.assertEqual((None, None, ''), (meta.data_percent,
                                            meta.allocated, meta.pool))

    def test_pool_usage(self):
        pool = thin.pool_usage(thin.parse_lvs(REPORT), 'cinder-volumes-pool')
        self.assertEqual(
            (100 * GIB, 40 * GIB, 60 * GIB, 100 * MIB, 10 * MIB, 90 * MIB,
             CHUNK),
            (pool.size, pool.data_used, pool.data_free, pool.metadata_size,
             pool.metadata_used, pool.metadata_free, pool.chunk_size))
        # The pool's own thin LVs only: not the thick metadata LV, not
        # another pool's LV.
        self.assertEqual(80 * GIB, pool.provisioned)

    def test_percentages_are_rounded_up(self):
        # 0.01 % of 3 bytes is a fraction of a byte: counted as one.
        lvs = thin.parse_lvs('  p|3|0.01|0.01|3|1|\n')
        pool = thin.pool_usage(lvs, 'p')
        self.assertEqual((1, 1), (pool.data_used, pool.metadata_used))

    @ddt.data('  p|1|2|3\n',                       # too few fields
              '  p|1|2|3|4|5|6|7\n',               # too many
              '  p|x|2.0|3.0|4|5|\n',              # size not a number
              '  p|1|two|3.0|4|5|\n',              # percent not a number
              '  p|1|nan|3.0|4|5|\n',
              '  p|-1|2.0|3.0|4|5|\n',
              '  |1|2.0|3.0|4|5|\n',               # no name
              '  p||2.0|3.0|4|5|\n')               # no size
    def test_a_bad_line_is_named(self, text):
        exc = self.assertRaises(exception.LVSParseError, thin.parse_lvs,
                                text)
        self.assertIn(text.strip(), str(exc))

    def test_no_such_pool(self):
        lvs = thin.parse_lvs(REPORT)
        self.assertRaises(exception.LVSParseError, thin.pool_usage, lvs,
                          'missing-pool')
        exc = self.assertRaises(exception.LVSParseError, thin.pool_usage,
                                lvs, 'volume-1')
        self.assertIn('not a thin pool', str(exc))


class NeedTestCase(test.TestCase):

    def test_metadata_per_chunk(self):
        pool = make_pool()
        self.assertEqual(48, pool.metadata_for(1))
        self.assertEqual(48 * 16, pool.metadata_for(MIB))
        self.assertEqual(MIB, pool.mappable(48 * 16))

    def test_unhydrated_bytes(self):
        statuses = [
            dmsetup.parse_clone_status(
                '8 40/4096 128 256/1024 16 0 0 rw'),
            dmsetup.parse_clone_status(
                '8 40/4096 8 0/10 0 1 no_hydration 0 rw'),
            dmsetup.FailedCloneStatus('Fail')]
        # 768 regions of 64 KiB, and 10 of 4 KiB: a failed clone tells
        # nothing.
        self.assertEqual(768 * 65536 + 10 * 4096,
                         thin.unhydrated_bytes(statuses))
        self.assertEqual(0, thin.unhydrated_bytes([]))

    def test_fits(self):
        # 60 GiB free, 10 reserved: 50 GiB to write; 80 + 20 GiB
        # provisioned within 90 GiB x 20.
        self.assertIsNone(thin.shortfall(
            make_pool(), virtual=20 * GIB, writes=20 * GIB, pending=30 * GIB,
            max_ratio=20.0, reserved_percentage=10))

    def test_data(self):
        short = thin.shortfall(make_pool(), virtual=20 * GIB,
                               writes=20 * GIB, pending=31 * GIB,
                               max_ratio=20.0, reserved_percentage=10)
        self.assertEqual(thin.Shortfall('data', 50 * GIB, 51 * GIB), short)

    def test_data_without_reserve(self):
        self.assertIsNone(thin.shortfall(
            make_pool(), virtual=20 * GIB, writes=20 * GIB, pending=40 * GIB,
            max_ratio=20.0, reserved_percentage=0))

    def test_metadata(self):
        # 1 MiB of metadata left maps 1.33 GiB of 64 KiB chunks.
        pool = make_pool(metadata_used=99 * MIB)
        short = thin.shortfall(pool, virtual=2 * GIB, writes=2 * GIB,
                               pending=0, max_ratio=20.0,
                               reserved_percentage=0)
        self.assertEqual(thin.Shortfall('metadata', MIB,
                                        2 * GIB // CHUNK * 48), short)
        self.assertIsNone(thin.shortfall(
            pool, virtual=2 * GIB, writes=GIB, pending=0, max_ratio=20.0,
            reserved_percentage=0))

    def test_metadata_reserve(self):
        pool = make_pool(metadata_used=80 * MIB)
        self.assertIsNone(thin.shortfall(
            pool, virtual=GIB, writes=GIB, pending=0, max_ratio=20.0,
            reserved_percentage=0))
        short = thin.shortfall(pool, virtual=GIB, writes=GIB, pending=0,
                               max_ratio=20.0, reserved_percentage=20)
        self.assertEqual('metadata', short.kind)
        self.assertEqual(0, short.available)

    def test_over_subscription(self):
        # (100 GiB - 10 reserved) x 1.0: 80 provisioned + 11 is too much.
        short = thin.shortfall(make_pool(), virtual=11 * GIB, writes=GIB,
                               pending=0, max_ratio=1.0,
                               reserved_percentage=10)
        self.assertEqual(thin.Shortfall('provisioned', 90 * GIB, 91 * GIB),
                         short)
        self.assertIsNone(thin.shortfall(
            make_pool(), virtual=10 * GIB, writes=GIB, pending=0,
            max_ratio=1.0, reserved_percentage=10))

    def test_free_bytes(self):
        pool = make_pool()
        self.assertEqual(60 * GIB, thin.free_bytes(pool, 0))
        self.assertEqual(50 * GIB, thin.free_bytes(pool, 10 * GIB))
        self.assertEqual(0, thin.free_bytes(pool, 70 * GIB))
        # Metadata that can map less than the free data bounds it.
        pool = make_pool(metadata_used=100 * MIB - 48 * 16)
        self.assertEqual(MIB, thin.free_bytes(pool, 0))


class MapNeedTestCase(test.TestCase):
    """What a move that applies a region map writes into a thin pool."""

    def test_copied_bytes_of_whole_regions_and_chunks(self):
        # 8 regions of 64 KiB, 64 KiB chunks: regions 1, 5 and 6 copied.
        self.assertEqual(3 * CHUNK, thin.copied_bytes(
            [(1, 2), (5, 7)], 1024, 128, CHUNK, 64))

    def test_a_chunk_partly_copied_is_allocated_whole(self):
        # 4 KiB regions in 64 KiB chunks: one region copied allocates its
        # chunk; two runs in one chunk count it once.
        self.assertEqual(CHUNK, thin.copied_bytes([(16, 17)], 1024, 8,
                                                  CHUNK, 64))
        self.assertEqual(CHUNK, thin.copied_bytes([(16, 17), (20, 21)],
                                                  1024, 8, CHUNK, 64))
        self.assertEqual(2 * CHUNK, thin.copied_bytes(
            [(16, 17), (40, 41)], 1024, 8, CHUNK, 64))

    def test_the_short_last_region_is_copied(self):
        # 1000 sectors: seven whole regions discarded, the short eighth
        # copied (its chunk allocated).
        self.assertEqual(CHUNK, thin.copied_bytes([], 1000, 128, CHUNK, 64))
        self.assertEqual(0, thin.copied_bytes([], 1024, 128, CHUNK, 64))

    def test_the_gaps_a_bounded_plan_keeps_are_copied(self):
        # every other region of 16 holds data; two discards only: 14 of
        # the 16 regions are copied.
        needed = [(i, i + 1) for i in range(1, 16, 2)]
        self.assertEqual(14 * CHUNK, thin.copied_bytes(needed, 2048, 128,
                                                       CHUNK, 2))
        self.assertEqual(8 * CHUNK, thin.copied_bytes(needed, 2048, 128,
                                                      CHUNK, 64))

    def test_headroom_is_the_rest_over_the_ratio(self):
        # The part of the volume the map does not copy counts as a new
        # thin volume of that size: its share of the pool under
        # max_over_subscription_ratio.
        self.assertEqual(math.ceil(0.75 * GIB / 20),
                         thin.headroom(GIB, GIB // 4, 20.0))
        self.assertEqual(0.75 * GIB, thin.headroom(GIB, GIB // 4, 1.0))
        self.assertEqual(0, thin.headroom(GIB, 2 * GIB, 20.0))

    def status(self, text='8 40/4096 128 256/1024 16 0 0 rw'):
        return dmsetup.parse_clone_status(text)

    def test_clone_writes_regions_that_fall_on_chunks(self):
        # 768 regions of 64 KiB left, 64 KiB chunks: exactly those.
        self.assertEqual(768 * CHUNK,
                         thin.clone_writes(self.status(), CHUNK, 65))
        # 128 KiB regions hold two whole chunks each: no more either.
        self.assertEqual(768 * 2 * CHUNK, thin.clone_writes(
            self.status('8 40/4096 256 256/1024 16 0 0 rw'), CHUNK, 65))

    def test_clone_writes_a_chunk_at_each_end_of_each_run(self):
        # 64 KiB regions in 256 KiB chunks: a chunk of which other
        # regions were discarded is allocated whole by the copy of one
        # region, at most at each end of each run of copied regions.
        self.assertEqual(768 * CHUNK + 2 * 4 * CHUNK,
                         thin.clone_writes(self.status(), 4 * CHUNK, 1))
        self.assertEqual(768 * CHUNK + 2 * 65 * 4 * CHUNK,
                         thin.clone_writes(self.status(), 4 * CHUNK, 65))
        # 192 KiB chunks: a region may straddle two.
        self.assertEqual(768 * CHUNK + 2 * 3 * CHUNK,
                         thin.clone_writes(self.status(), 3 * CHUNK, 1))
        # A clone fully hydrated writes nothing more.
        self.assertEqual(0, thin.clone_writes(
            self.status('8 40/4096 128 1024/1024 0 0 0 rw'), 4 * CHUNK, 65))

    def test_pending_bytes_per_move(self):
        lvs = thin.parse_lvs(REPORT)
        pool = thin.pool_usage(lvs, 'cinder-volumes-pool')
        clone = self.status()          # 768 regions of 64 KiB left
        # volume-1 (50 GiB, 25 % allocated) moves in with a map: its
        # loaded clone tells what it still copies, not LVM's 37.5 GiB.
        self.assertEqual(768 * CHUNK, thin.pending_bytes(
            lvs, pool, {'volume-1'}, {'volume-1': clone}, 65))
        # Not loaded (a reboot, or still being built): whole.
        self.assertEqual(37.5 * GIB, thin.pending_bytes(
            lvs, pool, {'volume-1'}, {}, 65))
        # A failed clone tells nothing: whole.
        self.assertEqual(37.5 * GIB, thin.pending_bytes(
            lvs, pool, {'volume-1'},
            {'volume-1': dmsetup.FailedCloneStatus('Fail')}, 65))
        # Never more than LVM says the LV can still allocate (volume-2 is
        # fully allocated).
        self.assertEqual(0, thin.pending_bytes(
            lvs, pool, {'volume-2'}, {'volume-2': clone}, 65))
        # A clone of an LV the report does not hold yet: the clone's
        # figure; an LV of another pool: nothing.
        self.assertEqual(768 * CHUNK, thin.pending_bytes(
            lvs, pool, {'volume-9', 'other'}, {'volume-9': clone}, 65))
