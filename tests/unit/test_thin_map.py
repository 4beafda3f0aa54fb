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

"""What a thin LV maps: thin_dump read, regions to copy, the map encoded."""

import random

import ddt

from cinder.tests.unit import test

from cinder_dmclone import dmsetup
from cinder_dmclone import exception
from cinder_dmclone import thin


def dump(*devices, block=128, defs=''):
    """thin_dump XML of a pool of ``block``-sector chunks."""
    return ('<superblock uuid="" time="1" transaction="3" flags="0" '
            'version="2" data_block_size="%d" nr_data_blocks="16384">\n'
            '%s%s</superblock>\n' % (block, defs, ''.join(devices)))


def device(dev_id, *mappings, mapped=None):
    body = ''.join('  %s\n' % m for m in mappings)
    count = ('' if mapped is False else ' mapped_blocks="%d"' % (
        mapped if mapped is not None else _count(mappings)))
    return ('<device dev_id="%d"%s transaction="0" creation_time="0" '
            'snap_time="1">\n%s</device>\n' % (dev_id, count, body))


def _count(mappings):
    total = 0
    for m in mappings:
        if m.startswith('<single_mapping'):
            total += 1
        elif m.startswith('<range_mapping'):
            total += int(m.split('length="')[1].split('"')[0])
    return total


def rng(origin, length, data=0):
    return ('<range_mapping origin_begin="%d" data_begin="%d" length="%d" '
            'time="0"/>' % (origin, data, length))


def one(origin, data=0):
    return '<single_mapping origin_block="%d" data_block="%d" time="0"/>' % (
        origin, data)


@ddt.ddt
class ParseThinDumpTestCase(test.TestCase):

    def test_ranges_and_singles_merged(self):
        text = dump(device(1, rng(0, 4), one(4), one(10), rng(11, 2),
                           one(20)))
        m = thin.parse_thin_dump(text, 1)
        self.assertEqual(128, m.block_sectors)
        self.assertEqual(((0, 5), (10, 13), (20, 21)), m.ranges)
        self.assertEqual(9, m.mapped_blocks)

    def test_empty_device(self):
        m = thin.parse_thin_dump(dump(device(7)), 7)
        self.assertEqual((), m.ranges)
        self.assertEqual(0, m.mapped_blocks)

    def test_only_the_asked_device_of_several(self):
        text = dump(device(1, rng(0, 100)), device(2, one(5), one(9)),
                    device(3, rng(50, 10)))
        self.assertEqual(((5, 6), (9, 10)), thin.parse_thin_dump(
            text, 2).ranges)

    def test_out_of_order_mappings_are_sorted(self):
        text = dump(device(1, one(9), rng(0, 2), one(2)))
        self.assertEqual(((0, 3), (9, 10)), thin.parse_thin_dump(
            text, 1).ranges)

    def test_shared_definitions_are_resolved(self):
        # thin-provisioning-tools 1.x: mappings a snapshot shares with
        # its origin are written once, in a <def>, and referenced
        defs = '<def name="7">\n  %s\n  %s\n</def>\n' % (rng(0, 4), one(8))
        text = dump(device(1, '<ref name="7"/>', one(20), mapped=6),
                    device(2, one(4), '<ref name="7"/>', mapped=6),
                    defs=defs)
        self.assertEqual(((0, 4), (8, 9), (20, 21)),
                         thin.parse_thin_dump(text, 1).ranges)
        self.assertEqual(((0, 5), (8, 9)),
                         thin.parse_thin_dump(text, 2).ranges)

    def test_streamed_in_pieces(self):
        text = dump(device(4, *[one(2 * i) for i in range(1000)]))
        pieces = (text[i:i + 7] for i in range(0, len(text), 7))
        m = thin.parse_thin_dump(pieces, 4)
        self.assertEqual(1000, len(m.ranges))
        self.assertEqual((1998, 1999), m.ranges[-1])

    def test_bytes(self):
        self.assertEqual(((0, 1),), thin.parse_thin_dump(
            dump(device(1, one(0))).encode(), 1).ranges)

    def test_without_mapped_blocks_attribute(self):
        self.assertEqual(((3, 4),), thin.parse_thin_dump(
            dump(device(1, one(3), mapped=False)), 1).ranges)

    @ddt.data(
        ('', 'not well-formed'),
        ('<superblock data_block_size="128"><device dev_id="1">',
         'not well-formed'),                                  # cut short
        ('garbage', 'not well-formed'),
        (dump(device(2, one(1))), 'no such device'),
        (dump(device(1, one(1)), device(1, one(2))), 'twice'),
        (dump(device(1, one(1), mapped=2)), 'mapped blocks'),
        (dump(device(1, rng(0, 4), one(2), mapped=5)), 'overlap'),
        (dump(device(1, '<single_mapping origin_block="x"/>', mapped=1)),
         'not a number'),
        (dump(device(1, '<single_mapping data_block="1"/>', mapped=1)),
         'not a number'),
        (dump(device(1, '<range_mapping origin_begin="0" length="0"/>',
                     mapped=0)), 'below 1'),
        (dump(device(1, '<single_mapping origin_block="-1"/>', mapped=1)),
         'below 0'),
        (dump(device(1, one(1)), block=0), 'below 1'),
        (dump(device(1, '<ref name="9"/>', mapped=0)), 'to no <def>'),
        (dump(device(1, '<bogus/>', mapped=0)), 'unknown element'),
        (dump(device(1)) + '<superblock data_block_size="1"/>',
         'not well-formed'),                                  # two roots
        ('<device dev_id="1"/>', 'outside a <superblock>'),
        (dump(one(3)), 'outside a <def> or <device>'),
        (dump(device(1, device(2)), block=128), 'inside'),
        ('<?xml version="1.0"?><x/>', 'outside a <superblock>'),
    )
    @ddt.unpack
    def test_malformed(self, text, reason):
        exc = self.assertRaises(exception.ThinDumpParseError,
                                thin.parse_thin_dump, text, 1)
        self.assertIn(reason, str(exc))


@ddt.ddt
class RegionsTestCase(test.TestCase):
    """Mapped chunks to needed regions, the rest to discards."""

    def _map(self, ranges, block=128):
        return thin.DeviceMap(dev_id=1, block_sectors=block,
                              ranges=tuple(ranges))

    def test_empty_map_needs_nothing_and_discards_everything(self):
        needed = thin.needed_regions(self._map([]), 1024, 128)
        self.assertEqual([], needed)
        self.assertEqual([(0, 1024)], thin.discard_ranges(needed, 1024, 128))

    def test_fully_mapped_needs_everything_and_discards_nothing(self):
        needed = thin.needed_regions(self._map([(0, 8)]), 1024, 128)
        self.assertEqual([(0, 8)], needed)
        self.assertEqual([], thin.discard_ranges(needed, 1024, 128))

    def test_same_sizes(self):
        needed = thin.needed_regions(self._map([(1, 2), (5, 7)]), 1024, 128)
        self.assertEqual([(1, 2), (5, 7)], needed)
        self.assertEqual([(0, 128), (256, 384), (896, 128)],
                         thin.discard_ranges(needed, 1024, 128))

    def test_region_larger_than_chunk(self):
        # chunks of 64 KiB, regions of 256 KiB: chunk 5 lies in region 1,
        # chunks 8-9 in region 2, chunk 15 in region 3
        needed = thin.needed_regions(self._map([(5, 6), (8, 10), (15, 16)]),
                                     4096, 512)
        self.assertEqual([(1, 4)], needed)
        self.assertEqual([(0, 512), (2048, 2048)],
                         thin.discard_ranges(needed, 4096, 512))

    def test_region_smaller_than_chunk(self):
        # chunks of 64 KiB, regions of 4 KiB: one chunk is 16 regions
        needed = thin.needed_regions(self._map([(1, 2), (3, 4)]), 1024, 8)
        self.assertEqual([(16, 32), (48, 64)], needed)
        self.assertEqual([(0, 128), (256, 128), (512, 512)],
                         thin.discard_ranges(needed, 1024, 8))

    def test_chunk_not_a_power_of_two(self):
        # LVM allows any multiple of 64 KiB: 192 KiB chunks over 128 KiB
        # regions; chunk 1 is sectors 384-768, regions 1 and 2
        needed = thin.needed_regions(self._map([(1, 2)], block=384),
                                     2048, 256)
        self.assertEqual([(1, 3)], needed)

    def test_length_not_a_multiple_of_the_region(self):
        # 1000 sectors, regions of 128: seven whole regions and a short
        # eighth, which a discard can never cover: it is always copied
        needed = thin.needed_regions(self._map([]), 1000, 128)
        self.assertEqual([], needed)
        self.assertEqual([(0, 896)], thin.discard_ranges(needed, 1000, 128))
        needed = thin.needed_regions(self._map([(7, 8)], block=128),
                                     1000, 128)
        self.assertEqual([(7, 8)], needed)
        self.assertEqual([(0, 896)], thin.discard_ranges(needed, 1000, 128))

    def test_blocks_past_the_clone_count_for_nothing(self):
        needed = thin.needed_regions(self._map([(2, 3), (8, 100)]), 1024,
                                     128)
        self.assertEqual([(2, 3)], needed)
        # a chunk straddling the end counts for the last region
        needed = thin.needed_regions(self._map([(7, 9)], block=128), 1000,
                                     128)
        self.assertEqual([(7, 8)], needed)

    def test_shorter_than_a_region(self):
        self.assertEqual([], thin.discard_ranges([], 100, 128))
        self.assertEqual([(0, 1)], thin.needed_regions(
            self._map([(0, 1)], block=8), 100, 128))

    def test_short_gaps_are_copied(self):
        needed = [(1, 2), (4, 5), (6, 7)]
        self.assertEqual([(0, 128), (256, 256), (640, 128), (896, 128)],
                         thin.discard_ranges(needed, 1024, 128))
        self.assertEqual([(256, 256)],
                         thin.discard_ranges(needed, 1024, 128,
                                             min_regions=2))

    def test_discard_plan_bounds_the_ranges(self):
        # every other region holds data: 8 one-region gaps
        needed = [(i, i + 1) for i in range(1, 16, 2)]
        self.assertEqual(8, len(thin.discard_plan(needed, 2048, 128, 8)))
        # at most 2 ranges: the first two of equal gaps
        self.assertEqual([(0, 128), (256, 128)],
                         thin.discard_plan(needed, 2048, 128, 2))
        needed = [(0, 1), (2, 3), (8, 9)]
        # gaps of 1, 5 and 7 regions; at most 2 ranges keep the long ones
        self.assertEqual([(384, 640), (1152, 896)],
                         thin.discard_plan(needed, 2048, 128, 2))
        self.assertEqual([(1152, 896)],
                         thin.discard_plan(needed, 2048, 128, 1))
        self.assertRaises(ValueError, thin.discard_plan, needed, 2048, 128,
                          0)

    def test_discard_plan_of_random_maps_stays_bounded_and_safe(self):
        rand = random.Random(7)
        for _ in range(100):
            total = rand.randint(1, 3000)
            needed = sorted({rand.randrange(total) for _ in range(
                rand.randint(0, 200))})
            runs = [(r, r + 1) for r in needed]
            bound = rand.randint(1, 20)
            plan = thin.discard_plan(runs, total * 128, 128, bound)
            self.assertLessEqual(len(plan), bound)
            for start, sectors in plan:
                first, end = start // 128, (start + sectors) // 128
                self.assertFalse(any(first <= r < end for r in needed))

    def test_bad_region_size(self):
        self.assertRaises(exception.InvalidTable, thin.needed_regions,
                          self._map([]), 1024, 100)
        self.assertRaises(exception.InvalidTable, thin.discard_ranges,
                          [], 1024, 4)

    def test_discards_never_touch_a_needed_region(self):
        rand = random.Random(19)
        for _ in range(300):
            block = rand.choice([8, 16, 128, 384, 1024])
            region = rand.choice([8, 64, 128, 512, 2048])
            length = rand.randint(1, 40000)
            blocks = -(-length // block) + 3
            ranges, pos = [], 0
            while pos < blocks:
                pos += rand.randint(1, 20)
                size = rand.randint(1, 20)
                ranges.append((pos, pos + size))
                pos += size + 1
            needed = thin.needed_regions(self._map(ranges, block), length,
                                         region)
            discards = thin.discard_ranges(
                needed, length, region, min_regions=rand.randint(1, 3))
            mapped = set()
            for first, end in ranges:
                mapped.update(range(first * block, min(end * block,
                                                       length)))
            for start, size in discards:
                self.assertEqual(0, start % region)
                self.assertEqual(0, size % region)
                self.assertLessEqual(start + size, length)
                self.assertEqual(set(),
                                 mapped & set(range(start, start + size)))
            # and every region outside the needed runs, whole and in the
            # clone, is discarded unless its gap was too short
            covered = set()
            for start, size in discards:
                covered.update(range(start // region,
                                     (start + size) // region))
            for first, end in needed:
                self.assertEqual(set(), covered & set(range(first, end)))


class MappedPartsTestCase(test.TestCase):
    """What of the ranges never copied a thin LV's blocks hold."""

    def _map(self, ranges, block=128):
        return thin.DeviceMap(dev_id=1, block_sectors=block,
                              ranges=tuple(ranges))

    def test_nothing_mapped_nothing_to_write(self):
        self.assertEqual([], thin.mapped_parts([(0, 1 << 30)],
                                               self._map([])))

    def test_parts_are_cut_to_the_mapped_blocks(self):
        block = 128 * 512
        # blocks 1 and 4-5 mapped; a range across both, one inside
        # block 4, one between them, one past them
        parts = thin.mapped_parts(
            [(block // 2, 2 * block), (3 * block, block // 2),
             (4 * block + 512, 1024), (7 * block, block)],
            self._map([(1, 2), (4, 6)]))
        self.assertEqual([(block, block), (4 * block + 512, 1024)], parts)

    def test_a_block_larger_than_the_ranges(self):
        # (A pool block of 1 MiB, regions of 64 KiB: the region in a
        # mapped block is written, whatever part of it the block's
        # data really holds.)
        block = 2048 * 512
        self.assertEqual(
            [(block + 65536, 65536)],
            thin.mapped_parts([(65536, 65536), (block + 65536, 65536)],
                              self._map([(1, 2)], block=2048)))

    def test_every_part_lies_within_the_ranges_and_the_map(self):
        import random
        rng = random.Random(7)
        for _ in range(200):
            block = rng.choice((1, 8, 128))
            mapped = sorted(rng.sample(range(64), rng.randrange(0, 20)))
            dmap = self._map([(b, b + 1) for b in mapped], block=block)
            edges = sorted(rng.sample(range(0, 64 * block), 8))
            ranges = [(edges[i] * 512, (edges[i + 1] - edges[i]) * 512)
                      for i in range(0, 8, 2) if edges[i + 1] > edges[i]]
            sectors = set()
            for offset, length in thin.mapped_parts(ranges, dmap):
                sectors.update(range(offset // 512,
                                     (offset + length) // 512))
            expected = {s for o, n in ranges
                        for s in range(o // 512, (o + n) // 512)
                        if s // block in set(mapped)}
            self.assertEqual(expected, sectors)


@ddt.ddt
class EncodeTestCase(test.TestCase):

    @ddt.data([], [(0, 1)], [(0, 100)], [(3, 4), (9, 20), (99, 100)])
    def test_round_trip(self, runs):
        text = thin.encode_regions(runs, 100, 128)
        self.assertEqual(runs, thin.decode_regions(text, 100, 128))

    def test_short_for_few_runs_of_a_huge_volume(self):
        # a 16 TiB volume in 64 KiB regions holding three runs of data
        total = 16 * 2 ** 40 // 65536
        runs = [(0, 4096), (10 ** 6, 10 ** 6 + 5), (total - 1, total)]
        text = thin.encode_regions(runs, total, 128)
        self.assertLess(len(text), 80)
        self.assertEqual(runs, thin.decode_regions(text, total, 128))

    def test_worst_case_stays_about_a_byte_per_region(self):
        runs = [(i, i + 1) for i in range(0, 100000, 2)]
        text = thin.encode_regions(runs, 100000, 8)
        self.assertLess(len(text), 100000)
        self.assertEqual(runs, thin.decode_regions(text, 100000, 8))

    def test_ascii_token(self):
        text = thin.encode_regions([(1, 5)], 10, 128)
        self.assertTrue(text.startswith('rmap1.128.10.4.'))
        self.assertRegex(text, r'^[A-Za-z0-9._-]+$')

    @ddt.data([(2, 1)], [(0, 0)], [(3, 5), (1, 2)], [(0, 2), (2, 3)],
              [(0, 101)], [(0, 2), (1, 3)])
    def test_bad_runs_are_not_encoded(self, runs):
        self.assertRaises(exception.RegionMapInvalid, thin.encode_regions,
                          runs, 100, 128)

    def test_another_geometry_is_refused(self):
        text = thin.encode_regions([(1, 2)], 100, 128)
        self.assertRaises(exception.RegionMapInvalid, thin.decode_regions,
                          text, 101, 128)
        self.assertRaises(exception.RegionMapInvalid, thin.decode_regions,
                          text, 100, 256)

    def test_tampered(self):
        good = thin.encode_regions([(1, 2), (5, 9)], 100, 128)
        head, payload = good.rsplit('.', 1)
        other = thin.encode_regions([(1, 2)], 100, 128).rsplit('.', 1)[1]
        for text in (None, '', 'rmap1', 'rmap2' + good[5:],
                     good.replace('.100.', '.x.'),
                     head + '.',                      # empty payload
                     head + '.' + payload[:-3],       # cut short
                     head + '.' + payload + 'AAAA',   # trailing data
                     head + '.!!!!',
                     head + '.' + other,              # count mismatch
                     'rmap1.128.100.6.' + payload):
            self.assertRaises(exception.RegionMapInvalid,
                              thin.decode_regions, text, 100, 128)

    def test_decompression_is_bounded(self):
        import base64
        import zlib
        bomb = base64.urlsafe_b64encode(zlib.compress(
            b'\x00' * 10 ** 6)).decode().rstrip('=')
        self.assertRaises(exception.RegionMapInvalid, thin.decode_regions,
                          'rmap1.128.100.0.' + bomb, 100, 128)


@ddt.ddt
class PoolZeroesTestCase(test.TestCase):
    """Whether a thin pool's table zeroes new blocks."""

    def _table(self, text):
        return dmsetup.parse_table(text)

    @ddt.data(('0 1024 thin-pool 253:1 253:2 128 0', True),
              ('0 1024 thin-pool 253:1 253:2 128 0 0', True),
              ('0 1024 thin-pool 253:1 253:2 128 0 1 ignore_discard', True),
              ('0 1024 thin-pool 253:1 253:2 128 0 1 skip_block_zeroing',
               False),
              ('0 1024 thin-pool 253:1 253:2 128 0 2 no_discard_passdown '
               'skip_block_zeroing', False))
    @ddt.unpack
    def test_zeroing(self, text, expected):
        self.assertEqual(expected, thin.pool_zeroes(self._table(text)))

    @ddt.data('', '0 1024 linear 253:1 0',
              '0 512 thin-pool 253:1 253:2 128 0\n'
              '512 512 thin-pool 253:1 253:2 128 0',
              '0 1024 thin-pool 253:1 253:2 128',
              '0 1024 thin-pool 253:1 253:2 128 0 x skip_block_zeroing',
              '0 1024 thin-pool 253:1 253:2 128 0 2 skip_block_zeroing',
              '0 1024 thin-pool 253:1 253:2 128 0 0 skip_block_zeroing')
    def test_anything_else_is_not_trusted(self, text):
        self.assertRaises(exception.ThinTableInvalid, thin.pool_zeroes,
                          self._table(text), 'vg-pool-tpool')


@ddt.ddt
class CheckThinTableTestCase(test.TestCase):
    """A thin LV's own table: its pool's map tells where its data is."""

    def test_plain_thin_device(self):
        thin.check_thin_table(dmsetup.parse_table(
            '0 2097152 thin 253:3 7\n'), 7)

    @ddt.data(('0 2097152 thin 253:3 7 253:9', 'external origin'),
              ('0 2097152 thin 253:3 8', 'not 7'),
              ('0 2097152 linear 8:16 0', 'not one thin segment'),
              ('', 'not one thin segment'),
              ('0 1024 thin 253:3 7\n1024 1024 thin 253:3 7',
               'not one thin segment'),
              ('0 2097152 thin 253:3', '1 arguments'))
    @ddt.unpack
    def test_anything_else_is_refused(self, text, reason):
        exc = self.assertRaises(exception.ThinTableInvalid,
                                thin.check_thin_table,
                                dmsetup.parse_table(text), 7, 'vg-lv')
        self.assertIn(reason, str(exc))

    def test_lv_device(self):
        self.assertEqual('cinder--volumes-volume--1',
                         thin.lv_device('cinder-volumes', 'volume-1'))


@ddt.ddt
class DumpBoundsTestCase(test.TestCase):
    """What bounds a map's cost: the thin LV's status, its pool's chunks.

    A tenant decides how fragmented its thin LV is (4 KiB written every
    128 KiB of a 1 TiB volume: 8 M single mappings, half a GB of XML), so
    the map is bounded before ``thin_dump`` runs and while it is read.
    """

    def _status(self, text):
        return dmsetup.parse_status(text)

    @ddt.data(('0 2097152 thin 262144 2097151', 262144),
              ('0 2097152 thin 0 -', 0))
    @ddt.unpack
    def test_mapped_sectors_of_a_thin_lv(self, text, expected):
        self.assertEqual(expected, thin.thin_mapped_sectors(
            self._status(text), 'vg-lv'))

    @ddt.data('', '0 2097152 thin Fail', '0 2097152 linear',
              '0 2097152 thin x 12', '0 2097152 thin -1 12',
              '0 2097152 thin 12', '0 1024 thin 0 -\n1024 1024 thin 0 -')
    def test_anything_else_is_refused(self, text):
        self.assertRaises(exception.ThinTableInvalid,
                          thin.thin_mapped_sectors, self._status(text),
                          'vg-lv')

    @ddt.data(('0 1024 thin-pool 253:1 253:2 128 0', 128),
              ('0 1024 thin-pool 253:1 253:2 1024 0 1 skip_block_zeroing',
               1024))
    @ddt.unpack
    def test_pool_block_sectors(self, text, expected):
        self.assertEqual(expected, thin.pool_block_sectors(
            dmsetup.parse_table(text), 'vg-pool-tpool'))

    @ddt.data('0 1024 thin-pool 253:1 253:2 0 0',
              '0 1024 thin-pool 253:1 253:2 x 0', '0 1024 linear 253:1 0')
    def test_pool_block_sectors_refused(self, text):
        self.assertRaises(exception.ThinTableInvalid,
                          thin.pool_block_sectors, dmsetup.parse_table(text),
                          'vg-pool-tpool')

    def test_mappings_bound(self):
        # Every mapping of the dump holds at least one block.
        self.assertEqual(0, thin.mappings_bound(0, 128))
        self.assertEqual(1, thin.mappings_bound(1, 128))
        self.assertEqual(2, thin.mappings_bound(256, 128))
        self.assertEqual(3, thin.mappings_bound(257, 128))

    def test_dump_bytes_bound(self):
        # A line of either mapping element, with numbers as long as a
        # 32-bit block count and time, fits DUMP_BYTES_PER_MAPPING.
        big = 4294967295
        line = '      %s\n' % rng(big, big, big).replace(
            'time="0"', 'time="%d"' % big)
        self.assertLessEqual(len(line), thin.DUMP_BYTES_PER_MAPPING)
        self.assertEqual(thin.DUMP_BYTES_SLACK
                         + 10 * thin.DUMP_BYTES_PER_MAPPING,
                         thin.dump_bytes_bound(10))

    def test_parse_refuses_more_mappings_than_allowed(self):
        text = dump(device(1, rng(0, 4), one(9), one(11)))
        self.assertEqual(((0, 4), (9, 10), (11, 12)), thin.parse_thin_dump(
            text, 1, max_mappings=3).ranges)
        self.assertRaises(exception.ThinDumpTooLarge, thin.parse_thin_dump,
                          text, 1, max_mappings=2)

    def test_other_devices_mappings_count_too(self):
        # (Another device's, or a <def>'s, are read as well.)
        text = dump(device(2, one(1), one(3)), device(1, one(9)))
        self.assertRaises(exception.ThinDumpTooLarge, thin.parse_thin_dump,
                          text, 1, max_mappings=2)
