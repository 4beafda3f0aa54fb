#!/bin/bash
#
# Stand-ins for the devstack functions the cinder-dmclone plugin calls, for
# devstack/tools/dry-run.sh: they write ini files for real (iniset/iniget
# through Python's configparser) and record every other action in
# $DRYRUN_LOG instead of touching the machine.
#
# Knobs: DRYRUN_MISSING_MODULES (modules modprobe fails on),
# DRYRUN_NO_CLONE_TARGET (dmsetup targets lists no clone),
# DRYRUN_DM_DEVICES ("name uuid" lines dmsetup info prints),
# DRYRUN_TYPE_EXISTS (the volume type exists already).

function _dryrun_log {
    echo "$*" >>"$DRYRUN_LOG"
}

function iniset {
    [[ "$1" == "-sudo" ]] && shift
    _dryrun_log "iniset $*"
    python3 - "$@" <<'PYEOF'
import configparser
import sys

path, section, option, value = sys.argv[1:5]
parser = configparser.RawConfigParser(interpolation=None)
parser.optionxform = str
parser.read(path)
if section != 'DEFAULT' and not parser.has_section(section):
    parser.add_section(section)
parser.set(section, option, value)
with open(path, 'w') as f:
    parser.write(f)
PYEOF
}

function iniget {
    python3 - "$@" <<'PYEOF'
import configparser
import sys

path, section, option = sys.argv[1:4]
parser = configparser.RawConfigParser(interpolation=None)
parser.optionxform = str
parser.read(path)
print(parser.get(section, option, fallback=''))
PYEOF
}

function is_service_enabled {
    local service
    for service in "$@"; do
        [[ ",$ENABLED_SERVICES," == *",$service,"* ]] && return 0
    done
    return 1
}

function trueorfalse {
    local default=$1 value=${!2:-}
    case "${value:-$default}" in
        1|yes|Yes|YES|true|True|TRUE|on|On|ON) echo True ;;
        *) echo False ;;
    esac
}

function die {
    local line=$1
    shift
    # fd 3: the dry run's own stderr (2 collects the plugin's xtrace)
    echo "[ERROR] line $line: $*" >&3
    _dryrun_log "die $*"
    exit 1
}

function setup_develop { _dryrun_log "setup_develop $*"; }
function pip_install_gr { _dryrun_log "pip_install_gr $*"; }
function install_package { _dryrun_log "install_package $*"; }
function init_lvm_volume_group { _dryrun_log "init_lvm_volume_group $*"; }
function clean_lvm_volume_group { _dryrun_log "clean_lvm_volume_group $*"; }

function openstack {
    _dryrun_log "openstack $*"
    if [[ " $* " == *" volume type show "* ]]; then
        [[ -n "${DRYRUN_TYPE_EXISTS:-}" ]]
        return
    fi
}

# sudo: file operations run for real (the dry run points every path into
# its work directory), kernel and device-mapper commands are faked.
function sudo {
    _dryrun_log "sudo $*"
    case "$1" in
        modprobe)
            [[ " ${DRYRUN_MISSING_MODULES:-} " != *" $2 "* ]]
            ;;
        dmsetup)
            case "$2" in
                targets)
                    [[ -n "${DRYRUN_NO_CLONE_TARGET:-}" ]] || \
                        echo "clone            v1.0.0"
                    echo "linear           v1.4.0"
                    ;;
                info) [[ -z "${DRYRUN_DM_DEVICES:-}" ]] || \
                    printf '%s\n' "$DRYRUN_DM_DEVICES" ;;
            esac
            ;;
        install|tee|mkdir|rm) "$@" ;;
        *) echo "fake sudo: unexpected command: $*" >&2; return 1 ;;
    esac
}
