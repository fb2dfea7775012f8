pub mod containers;
pub mod credentials;
pub mod harness;
pub mod reports;
pub mod streams;
pub mod workers;

/// For the test programs that run as a container's first process (PID 1), which the
/// kernel spares the default action of SIGTERM: exits at once on SIGTERM or SIGINT, as
/// the kubelet expects when it stops the container. Call before starting any thread,
/// so every thread inherits the blocked signals and only the waiting one takes them.
pub fn exit_on_termination() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if set.thread_block().is_ok() {
        std::thread::spawn(move || {
            if set.wait().is_ok() {
                std::process::exit(0);
            }
        });
    }
}
