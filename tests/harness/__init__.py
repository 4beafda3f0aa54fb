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

"""The code that drives nodes, for every suite; no tests of its own.

The suites (tests/functional, tests/faults, tests/bench, tests/demo and,
for the in-memory model, tests/unit) state their scenarios; what they
drive lives here, one role per module.

In the testbed guest only (they act on its kernel, its processes or its
Cinder services; importing them anywhere is harmless):

* ``testbed``: the guest's kernel from the tests' side (LVM,
  device-mapper, LIO, open-iscsi, O_DIRECT I/O, data patterns), the
  topology, the leak check and the nodes' power; standard library only,
  so that it also runs as ``python -m tests.harness.testbed`` on
  another node's kernel;
* ``workers``: :class:`workers.NodeProcess`, a Python worker on a node
  that runs pickled callables there (``python -m tests.harness.workers
  --serve``);
* ``services``: the full Cinder stack (MariaDB, RabbitMQ, etcd,
  cinder-api, cinder-scheduler, a cinder-volume per node): start, watch,
  kill, restart, power a node off and boot it;
* ``api``: :class:`api.Cloud`, that stack's API as users and Nova use
  it (cinderclient, Nova's attachment flow with os-brick on the node);
* ``volume_node``: one node's volume service in a worker (the real
  driver, what the volume manager does around it, the peer calls over a
  UNIX socket or TCP between kernels, crash points);
* ``driver_cluster``: :class:`driver_cluster.Cluster`, both nodes'
  volume services over one database (a SQLite file in one kernel, the
  control plane's MariaDB and etcd on separate kernels), the records the
  API side keeps, and each node's kernel looked at where it is;
* ``steps`` and ``driver_steps``: the scenario steps the suites share,
  over :class:`api.Cloud` and over :class:`driver_cluster.Cluster`.

Anywhere (the unit tests, the suites' conftest.py outside the guest):

* ``fake_cluster``: two nodes over in-memory fakes, for the unit tests
  of a move;
* ``manager_flow``: the volume manager's driver calls around a
  connection, shared by ``fake_cluster`` and ``volume_node``;
* ``selection``: which tests run (``--tier``, the testbed layout, skip
  outside the guest) and the per-module timings;
* ``pytest_fixtures``: the suites' shared fixtures, imported by name by
  each suite's conftest.py.
"""
