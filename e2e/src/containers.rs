//! The host's view of the node's containers, for tests that act as the kernel would:
//! SIGKILL a container's process (the OOM killer), or check that it is gone.
//!
//! The local stack's kubelet runs containers with runc under the cgroupfs driver, so a
//! container's processes sit in a cgroup whose path ends in its container ID
//! (`…/pod<uid>/<id>`), and their PIDs are visible from the host. Owns no state and
//! never touches a container through the runtime; only reads `/proc` and signals.

use std::collections::BTreeSet;

use crate::streams::pod_field;

/// The ID in a `containerStatuses[].containerID` (`containerd://<id>`).
fn bare_id(container_id: &str) -> &str {
    container_id
        .rsplit_once("://")
        .map_or(container_id, |(_, id)| id)
}

/// Whether a line of `/proc/<pid>/cgroup` puts the process in the container `id`.
fn cgroup_names_container(cgroup: &str, id: &str) -> bool {
    cgroup.lines().any(|line| {
        line.rsplit(':')
            .next()
            .is_some_and(|path| path.trim_end_matches('/').ends_with(&format!("/{id}")))
    })
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The host PID of the container's first process (the one runc started, whose parent
/// is the shim outside the container), if the container runs.
pub fn main_pid(container_id: &str) -> Option<i32> {
    let id = bare_id(container_id);
    if id.is_empty() {
        return None;
    }
    let members: BTreeSet<i32> = std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| cgroup_names_container(&c, id))
        })
        .collect();
    members
        .iter()
        .copied()
        .find(|pid| parent_of(*pid).is_none_or(|p| !members.contains(&p)))
}

/// The host PID of `container` in pod `ns/pod` as the API reports it now.
pub fn pod_container_pid(ns: &str, pod: &str, container: &str) -> Option<i32> {
    let id = pod_field(
        ns,
        pod,
        &format!("{{.status.containerStatuses[?(@.name==\"{container}\")].containerID}}"),
    );
    main_pid(&id)
}

/// Whether `pid` runs (a zombie counts as gone).
pub fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                .is_none_or(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// SIGKILLs `container` of pod `ns/pod`, as the OOM killer would; panics if it does not
/// run.
pub fn kill9(ns: &str, pod: &str, container: &str) {
    let pid = pod_container_pid(ns, pod, container)
        .unwrap_or_else(|| panic!("container {container} of pod {ns}/{pod} has no process"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap_or_else(|e| panic!("SIGKILL {pid} ({ns}/{pod} {container}): {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_path_ending_in_the_id_names_the_container() {
        let cgroup = "12:pids:/kubepods/besteffort/pod1234/abc\n0::/\n";
        assert!(cgroup_names_container(cgroup, "abc"));
        assert!(!cgroup_names_container(cgroup, "ab"));
        assert!(!cgroup_names_container("0::/\n", "abc"));
    }

    #[test]
    fn the_runtime_prefix_is_dropped_from_a_container_id() {
        assert_eq!(bare_id("containerd://abc"), "abc");
        assert_eq!(bare_id("abc"), "abc");
    }
}
