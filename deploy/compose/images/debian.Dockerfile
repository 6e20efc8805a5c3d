# The Debian base of the images local-images.sh builds: a `debootstrap --variant=minbase` root file
# system imported as ROOTFS, plus what a container build needs.
ARG ROOTFS=localhost/z9-compose/debian-rootfs:bookworm
FROM ${ROOTFS}

ENV DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8
# No service starts inside a build (a package's postinst asks policy-rc.d); no recommends, no
# translations, no documentation: the images stay small.
RUN printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d \
    && printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\nAcquire::Languages "none";\n' \
       > /etc/apt/apt.conf.d/90z9-compose \
    && printf 'path-exclude /usr/share/doc/*\npath-exclude /usr/share/man/*\npath-exclude /usr/share/locale/*\n' \
       > /etc/dpkg/dpkg.cfg.d/90z9-compose
# The release with its updates and security fixes (debootstrap writes the release alone).
ARG DEBIAN_MIRROR=http://deb.debian.org/debian
ARG DEBIAN_SECURITY_MIRROR=http://deb.debian.org/debian-security
RUN . /etc/os-release \
    && printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
       "$DEBIAN_MIRROR" "$VERSION_CODENAME" "$DEBIAN_MIRROR" "$VERSION_CODENAME" \
       "$DEBIAN_SECURITY_MIRROR" "$VERSION_CODENAME" > /etc/apt/sources.list
# The host's own certificate authorities (local-images.sh copies /usr/local/share/ca-certificates
# into local-ca/), so that HTTPS through a TLS-inspecting proxy works in the builds as on the host.
COPY local-ca/ /usr/local/share/ca-certificates/
RUN apt-get update -q \
    && apt-get install -y -q ca-certificates \
    && update-ca-certificates \
    && apt-get upgrade -y -q \
    && rm -rf /var/lib/apt/lists/*
