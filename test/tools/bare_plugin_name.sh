#!/bin/sh
# A plugin named by a bare file name is the file of that name in the current directory, as a
# newcomer expects (`cd build/plugins && nxmem conform plugin.so`); it is never handed to dlopen's
# library search, which would look in the system's directories and fail with "cannot open shared
# object file". A bare name that does not exist says so, naming ./NAME.
# Usage: bare_plugin_name.sh NXMEM_TOOL PLUGIN_PATH
tool=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") # absolute: the test changes directory
plugin=$2
cd "$(dirname "$plugin")" || exit 1
name=$(basename "$plugin")
for subcommand in inspect conform; do
    out=$("$tool" "$subcommand" "$name" 2>&1) || {
        printf '%s\n' "$out" >&2
        echo "bare_plugin_name.sh: 'nxmem $subcommand $name' in the plugin's directory failed" >&2
        exit 1
    }
done
out=$("$tool" inspect "no-such-$name" 2>&1) && {
    echo "bare_plugin_name.sh: 'nxmem inspect no-such-$name' succeeded" >&2
    exit 1
}
printf '%s\n' "$out" | grep -q "\./no-such-$name" || {
    printf '%s\n' "$out" >&2
    echo "bare_plugin_name.sh: the refusal of a missing bare name does not name ./no-such-$name" >&2
    exit 1
}
exit 0
