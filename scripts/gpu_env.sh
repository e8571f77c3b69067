# shellcheck shell=bash
# Sourced by scripts/gpu_check.sh on the GPU machine (bash, from the project's root): the
# Debian packages that scripts/gpu_prepare.sh put in .device/debs are unpacked once under
# /opt/deb (never into /, where Ubuntu's own libraries stay), and the compiler, pkg-config,
# the loader and PATH are pointed at them.
deb=/opt/deb
lib=$deb/usr/lib/x86_64-linux-gnu
if [ ! -f $deb/.unpacked ]; then
    mkdir -p $deb/pc
    for f in .device/debs/*.deb; do dpkg -x "$f" $deb; done
    # UCX's runtime packages ship only the versioned names; MPICH's link wants the plain ones
    for f in libucp libucs libuct libucm; do
        [ -e $lib/$f.so.0 ] && ln -sf $lib/$f.so.0 $lib/$f.so
    done
    # Criterion's own .pc requires the .pc files of its dependencies, absent here: a plain one
    cat >$deb/pc/criterion.pc <<'PC'
prefix=/usr
libdir=${prefix}/lib/x86_64-linux-gnu
includedir=${prefix}/include
Name: criterion
Description: Criterion
Version: 2.4.1
Libs: -L${libdir} -lcriterion
Cflags: -I${includedir}
PC
    touch $deb/.unpacked
fi
export PATH=$deb/usr/bin:$PATH
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:${LD_LIBRARY_PATH:-}
export PKG_CONFIG_PATH=$deb/pc:$lib/pkgconfig:$lib/openblas-pthread/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$deb
# headers of both kinds, plain (/usr/include) and per architecture (sleef.h is in the latter),
# searched as system folders (as /usr/include is here: their own warnings do not fail -Werror)
inc=$deb/usr/include:$deb/usr/include/x86_64-linux-gnu
export C_INCLUDE_PATH=$inc CPLUS_INCLUDE_PATH=$inc
export LIBRARY_PATH=$lib:$lib/openblas-pthread
export OPENBLAS_NUM_THREADS=1
