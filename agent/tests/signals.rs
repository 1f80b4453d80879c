//! The agent's signal set-up leaves every child with the signals it takes (SIGTERM,
//! SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) unblocked and at their default action,
//! however the child is started: here by a plain
//! `std::process::Command` from a thread started after the set-up, as the uploader's
//! thread starts the AWS SDK's `credential_process` helper. Its own test binary: the
//! set-up is process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use trainprof_agent::process::signals;

/// The bits of `field` (`SigBlk`, `SigCgt`, `SigIgn`) in a child's `/proc/self/status`.
fn child_mask(field: &str) -> u64 {
    let script = format!("grep '^{field}:' /proc/self/status");
    let out = Command::new("sh").arg("-c").arg(script).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    u64::from_str_radix(text.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

fn bit(sig: libc::c_int) -> u64 {
    1 << (sig - 1)
}

#[test]
fn a_child_started_anywhere_in_the_agent_has_the_signals_unblocked_and_default() {
    let taken = signals::Taken::from_dispositions();
    let installed = signals::install(taken).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _thread = signals::spawn(installed, move |s| {
        let _ = tx.send(s.signo);
    })
    .unwrap();
    let (blk, cgt) = std::thread::spawn(|| (child_mask("SigBlk"), child_mask("SigCgt"))).join().unwrap();
    for sig in signals::SIGNALS.into_iter().filter(|&s| taken.contains(s)) {
        assert_eq!(blk & bit(sig), 0, "{} blocked in the child: SigBlk {blk:x}", signals::name(sig));
        assert_eq!(cgt & bit(sig), 0, "{} caught in the child: SigCgt {cgt:x}", signals::name(sig));
    }
    // And the agent still takes them, once each.
    if taken.contains(libc::SIGHUP) {
        signals::send(std::process::id(), libc::SIGHUP).unwrap();
        assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(), libc::SIGHUP);
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err());
    }
}
