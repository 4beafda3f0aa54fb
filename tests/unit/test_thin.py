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
