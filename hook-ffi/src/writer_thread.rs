//! The writer thread: started by [`Hook::spawn_writer`] at `trainprof_init`, stopped by
//! [`Hook::stop_writer`] at `trainprof_shutdown` (ARCHITECTURE.md, "Inside the trainer").
//! It pops events in batches, writes them through one [`TimelineWriter`], publishes the
//! writer's counts after every batch and after the final seal, re-reads the config at
//! most once a second and hands a changed one to the trainer through `pending`. It
//! sleeps 10 ms when the queue is empty: the trainer never wakes it (that would be a
//! syscall on the hot path).

use std::sync::atomic::Ordering::*;
use std::sync::{Arc, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use trainprof_config::{Loader, Reload};

use crate::hook::Hook;
use crate::lock;
use crate::writer::{self, TimelineWriter};

impl Hook {
    /// Starts the native sampler thread ([`crate::native`]) the first time the config
    /// asks for native profiling; a failure is one line and the feature stays off.
    fn start_native_if_configured(self: &Arc<Self>) {
        if !self.native.wants_thread() {
            return;
        }
        let mut slot = lock(&self.native_thread);
        if slot.is_some() || self.native_spawn_failed.load(Relaxed) {
            return;
        }
        match crate::native::spawn(Arc::clone(self)) {
            Ok(h) => *slot = Some(h),
            Err(e) => {
                self.native_spawn_failed.store(true, Relaxed);
                crate::log(&format_args!(
                    "cannot start the native sampler thread: {e}; native profiling is off"
                ));
            }
        }
    }

    /// Starts the writer thread. `loader` re-reads the config; `clock` gives µs since the
    /// epoch.
    pub fn spawn_writer(self: &Arc<Self>, loader: Option<Loader>, clock: fn() -> i64) -> std::io::Result<()> {
        let hook = Arc::clone(self);
        // Takes no signal of the trainer's (docs/trainer.md, "Signals").
        crate::signals::spawn_thread("trainprof-writer", move || {
            let ran =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.run_writer(loader, clock)));
            if ran.is_err() {
                // A bug, not a state: stop recording, count what is left, never hang a
                // shutdown.
                hook.enabled.store(false, Relaxed);
                hook.stop.store(true, SeqCst);
                while hook.in_flight.sum() != 0 {
                    thread::yield_now();
                }
                let left = std::iter::from_fn(|| hook.queue.pop()).count() as u64;
                hook.counters.dropped_writer_died.fetch_add(left, Relaxed);
                crate::log(&format_args!(
                    "the writer thread failed; recording is off ({left} queued events dropped)"
                ));
                // `stop` is set: the sampler thread ends its window, writes its files and
                // returns (the normal path joined it already).
                if let Some(h) = lock(&hook.native_thread).take() {
                    let _ = h.join();
                }
            }
            let (done, cv) = &hook.finished;
            *lock(done) = true;
            cv.notify_all();
        })?;
        Ok(())
    }

    /// Asks the writer to drain the queue, seal its file and stop; waits at most `timeout`.
    /// True when it finished in time.
    pub fn stop_writer(&self, timeout: Duration) -> bool {
        self.stop.store(true, SeqCst);
        let (done, cv) = &self.finished;
        let deadline = Instant::now() + timeout;
        let mut finished = lock(done);
        while !*finished {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            finished = cv.wait_timeout(finished, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    /// Writes up to 4096 queued events through `w`: how many.
    fn drain_batch(&self, w: &mut TimelineWriter, names: &mut Vec<Arc<str>>, clock: fn() -> i64) -> usize {
        let mut n = 0usize;
        while let Some(ev) = self.queue.pop() {
            let top = ev
                .phase
                .max(ev.name)
                .max(ev.args().iter().map(|a| a.key).max().unwrap_or(0))
                .max(ev.requested_info().map_or(0, |r| r.id_name));
            if top as usize >= names.len() {
                self.names.copy_new(names);
            }
            w.write(&ev, names, clock());
            n += 1;
            if n == 4096 {
                break;
            }
        }
        n
    }

    fn run_writer(self: &Arc<Self>, mut loader: Option<Loader>, clock: fn() -> i64) {
        let mut w = TimelineWriter::new(self.writer.clone(), self.base_us);
        let mut names: Vec<Arc<str>> = Vec::new();
        let mut last_reload = clock();
        // On-demand windows (`trainprof trigger`): the request folder, looked at from here.
        let mut requests = crate::request::Poller::start(self, clock());
        loop {
            let stopping = self.stop.load(SeqCst);
            let mut n = self.drain_batch(&mut w, &mut names, clock);
            // Detailed windows' torch traces handed back (docs/formats.md, "Detailed windows
            // through torch's own trace"), the queue drained as they are read.
            let mut drained = 0usize;
            crate::torch_trace::run_jobs(self, &mut w, &mut names, clock, &mut |w, names| {
                drained += self.drain_batch(w, names, clock);
            });
            n += drained;
            let now = clock();
            if n > 0 {
                w.flush(now);
            }
            w.rotate_if_due(now);
            self.start_native_if_configured();
            self.counters.publish(&w.counts());
            if stopping && self.in_flight.sum() == 0 && self.queue.is_empty() {
                // The sampler thread sees `stop`, ends its window and writes its files.
                if let Some(h) = lock(&self.native_thread).take() {
                    let _ = h.join();
                }
                w.close(clock());
                self.counters.publish(&w.counts());
                requests.stop();
                self.torch_traces_drop();
                return;
            }
            if let Some(l) = loader.as_mut()
                && now.saturating_sub(last_reload) >= 1_000_000
            {
                last_reload = now;
                if l.reload() == Reload::Changed {
                    let c = l.config();
                    crate::log(&format_args!(
                        "config changed ({}); new windows apply from the next step",
                        l.loaded().path.display()
                    ));
                    for p in &c.problems {
                        crate::log(&format_args!("config: {}: {}", p.key, p.message));
                    }
                    w.set_rotation(c.rotate_max_file_size, writer::interval_us(c.rotate_close_interval_s));
                    *lock(&self.pending) = Some(Box::new(c.clone()));
                }
            }
            requests.poll(self, now);
            if n == 0 {
                thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
