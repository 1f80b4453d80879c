//! The GPU sampler on a scripted [`GpuSource`], and the real [`NvmlSource`] over the fake
//! `libnvidia-ml.so.1` (`tests/c/fake_nvml.c`).

use std::collections::{HashMap, VecDeque};
use std::process::Command;

use super::*;
use crate::pipeline::sample::vocabulary_ok;

const NS: GpuReadError = GpuReadError::NotSupported("NVML_ERROR_NOT_SUPPORTED");

/// A scripted source: per (GPU, query) a list of answers, one per call, the last one
/// repeated (a query with no script is not supported); calls are counted; events per tick.
#[derive(Debug, Default)]
struct Script {
    gpus: Vec<u32>,
    answers: HashMap<(u32, Query), Vec<Result<Reading, GpuReadError>>>,
    calls: HashMap<(u32, Query), usize>,
    events_for: Vec<u32>,
    events: VecDeque<Vec<(u32, GpuEvent)>>,
}

impl Script {
    /// Two GPUs answering the five basic queries.
    fn two_gpus() -> Script {
        let mut s = Script { gpus: vec![0, 1], ..Script::default() };
        for i in [0u32, 1] {
            s.answer(
                i,
                Query::Utilization,
                &[Ok(Reading::Utilization { gpu_percent: 90 + i, memory_busy_percent: 40 + i })],
            );
            s.answer(i, Query::Memory, &[Ok(Reading::Memory { used_bytes: 1 << 30, total_bytes: 4 << 30 })]);
            s.answer(i, Query::Power, &[Ok(Reading::PowerMilliwatts(250_500 + i))]);
            s.answer(i, Query::Temperature, &[Ok(Reading::TemperatureCelsius(60 + i))]);
            s.answer(i, Query::SmClock, &[Ok(Reading::SmClockMhz(1410 + i))]);
        }
        s
    }

    fn answer(&mut self, gpu: u32, q: Query, a: &[Result<Reading, GpuReadError>]) {
        self.answers.insert((gpu, q), a.to_vec());
    }

    fn calls(&self, gpu: u32, q: Query) -> usize {
        self.calls.get(&(gpu, q)).copied().unwrap_or(0)
    }
}

impl GpuSource for Script {
    fn devices(&self) -> Vec<u32> {
        self.gpus.clone()
    }

    fn facts(&mut self, index: u32) -> GpuFacts {
        GpuFacts {
            index,
            name: Some(format!("Scripted {index}")),
            events: self.events_for.contains(&index),
            ..GpuFacts::default()
        }
    }

    fn read(&mut self, index: u32, query: Query) -> Result<Reading, GpuReadError> {
        let n = self.calls.entry((index, query)).or_default();
        *n += 1;
        match self.answers.get(&(index, query)) {
            Some(answers) => answers[(*n - 1).min(answers.len() - 1)].clone(),
            None => Err(NS),
        }
    }

    fn poll_events(&mut self, out: &mut Vec<(u32, GpuEvent)>) -> Result<(), GpuReadError> {
        out.extend(self.events.pop_front().unwrap_or_default());
        Ok(())
    }
}

/// GPU `index`'s `dimension`, under the Type and Name it belongs to.
fn get(m: &Metrics, index: u32, dimension: &str) -> Option<f64> {
    let (kind, name) = placed(dimension, index);
    m.get(kind.as_str(), &name.to_string(), dimension)
}

/// The default cadence but the once-a-second readings on every tick (tests of each read's
/// errors).
const SECOND_EVERY_TICK: Cadence = Cadence { second: Duration::ZERO, ..Cadence::DEFAULT };

fn tick<S: GpuSource>(s: &mut GpuSampler<S>) -> Metrics {
    tick_at(s, Duration::ZERO)
}

fn tick_at<S: GpuSource>(s: &mut GpuSampler<S>, now: Duration) -> Metrics {
    let mut m = Metrics::new();
    s.sample(now, &mut m).unwrap();
    m
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

const BASIC_DIMENSIONS: [&str; 7] = [
    GPU_UTILIZATION,
    GPU_MEMORY_UTILIZATION,
    GPU_MEMORY_BUSY_PERCENT,
    GPU_MEM_USED_BYTES,
    GPU_POWER_WATTS,
    GPU_TEMPERATURE_CELSIUS,
    GPU_SM_CLOCK_MHZ,
];

/// Every dimension this sampler can write.
fn all_dimensions() -> Vec<&'static str> {
    let mut d = BASIC_DIMENSIONS.to_vec();
    d.extend([
        GPU_BUSY_MAX_PERCENT,
        GPU_MEMORY_BUSY_MAX_PERCENT,
        GPU_THROTTLE_MASK,
        GPU_XID_EVENTS,
        GPU_ECC_SINGLE_BIT_EVENTS,
        GPU_ECC_DOUBLE_BIT_EVENTS,
        TRAINER_PROCESSES,
        TRAINER_MEM_USED_BYTES,
        TRAINER_SM_BUSY_PERCENT,
        TRAINER_MEMORY_BUSY_PERCENT,
        UNATTRIBUTED_PROCESSES,
        UNATTRIBUTED_MEM_USED_BYTES,
        UNATTRIBUTED_SM_BUSY_PERCENT,
    ]);
    d.extend(THROTTLE_FLAGS.map(|(_, n)| n));
    d.extend(TOP_PROCESS.iter().flatten());
    d.extend(Field::ALL.map(Field::dimension));
    d.extend(GpmMetric::ALL.map(GpmMetric::dimension));
    d
}

#[test]
fn every_row_is_in_the_vocabulary() {
    let all = all_dimensions();
    for d in &all {
        let (kind, name) = placed(d, 3);
        assert!(vocabulary_ok(kind.as_str(), &name.to_string(), d), "{kind}/{name}/{d}");
        // Non-percentages never say Percent, and nothing new claims to be a GPU figure.
        if kind == MetricType::Accelerator && !d.ends_with("Percent") {
            assert!(!d.contains("GPU") && !d.contains("Memory") && !d.contains("Utilization"), "{d}");
        }
    }
    let mut unique = all.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), all.len(), "a dimension is used twice");
}

#[test]
fn every_gpu_gets_every_basic_dimension_with_its_name_and_unit() {
    let mut s = GpuSampler::new(Script::two_gpus());
    assert_eq!(s.name(), "gpu");
    assert_eq!(s.facts().len(), 2);
    assert_eq!(s.facts()[1].name.as_deref(), Some("Scripted 1"));
    let m = tick(&mut s);
    assert_eq!(m.len(), 14);
    for (gpu, dimension) in [0, 1].into_iter().flat_map(|g| BASIC_DIMENSIONS.map(|d| (g, d))) {
        assert!(get(&m, gpu, dimension).is_some(), "{gpu} {dimension}");
    }
    // Under Type `gpu` only the two percentages, one Name per GPU.
    let under_gpu: Vec<_> = m.as_slice().iter().filter(|x| x.kind == "gpu").collect();
    assert_eq!(under_gpu.len(), 4);
    assert!(under_gpu.iter().all(|x| [GPU_UTILIZATION, GPU_MEMORY_UTILIZATION].contains(&x.dimension)));
    assert!(m.as_slice().iter().all(|x| x.kind == "gpu" || x.kind == "accelerator"));
    assert_eq!(m.as_slice()[0].name, Name::Indexed("gpu", 0));
    assert_eq!(m.as_slice()[1].name, Name::Indexed("device", 0));
    assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(90.0));
    assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(91.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
    assert_eq!(get(&m, 1, GPU_MEMORY_BUSY_PERCENT), Some(41.0));
    assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some(1073741824.0));
    assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(250.5));
    assert_eq!(get(&m, 1, GPU_POWER_WATTS), Some(250.501));
    assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
    assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), Some(1410.0));
    assert_eq!(s.failures(), 0);
    // Without a trainer the process lists are never asked for.
    assert_eq!(s.source.calls(0, Query::Processes) + s.source.calls(0, Query::ProcessUtilization), 0);
    // smdebug draws dimensions containing "Memory" as percentages.
    assert!(!GPU_MEM_USED_BYTES.contains("Memory"));
}

#[test]
fn not_supported_switches_off_that_query_of_that_gpu_only() {
    let mut script = Script::two_gpus();
    script.answer(1, Query::Power, &[Err(NS)]);
    let mut s = GpuSampler::new(script).with_cadence(SECOND_EVERY_TICK);
    for _ in 0..3 {
        let m = tick(&mut s);
        assert_eq!(m.len(), 13);
        assert_eq!(get(&m, 1, GPU_POWER_WATTS), None);
        assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(250.5));
        assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
    }
    assert_eq!(s.source.calls(1, Query::Power), 1, "never asked again");
    assert_eq!(s.source.calls(0, Query::Power), 3);
    assert_eq!(s.source.calls(1, Query::SmClock), 3);
    // Every unscripted query was asked once and switched off.
    for q in [Query::UtilizationSamples, Query::Throttle, Query::Fields, Query::Gpm] {
        assert_eq!(s.source.calls(0, q), 1, "{q:?}");
    }
    let off: Vec<Query> = s.switched_off(1).collect();
    assert!(off.contains(&Query::Power) && !off.contains(&Query::Temperature), "{off:?}");
    assert!(!s.switched_off(0).any(|q| q == Query::Power));
    assert_eq!(s.failures(), 0);
}

#[test]
fn transient_errors_leave_the_tick_out_and_are_asked_again() {
    let lost = Err(GpuReadError::Failed("GPU lost"));
    let unknown = Err(GpuReadError::Failed("unknown"));
    let mut script = Script::two_gpus();
    script.answer(
        0,
        Query::Temperature,
        &[unknown.clone(), unknown, lost.clone(), Ok(Reading::TemperatureCelsius(70))],
    );
    script.answer(1, Query::Memory, &[lost]);
    let mut s = GpuSampler::new(script).with_cadence(SECOND_EVERY_TICK);
    for t in 0..3 {
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), None, "tick {t}");
        assert_eq!(get(&m, 1, GPU_MEMORY_UTILIZATION), None);
        assert_eq!(get(&m, 1, GPU_MEM_USED_BYTES), None);
        assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
        assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(61.0));
        assert_eq!(m.len(), 11);
    }
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), Some(70.0));
    assert_eq!(s.source.calls(0, Query::Temperature), 4);
    assert_eq!(s.source.calls(1, Query::Memory), 4);
    assert_eq!(s.failures(), 3 + 4);
    assert_eq!(s.gpus[0].queries[Query::Temperature.slot()], QueryState::Ok);
    assert_eq!(
        s.gpus[1].queries[Query::Memory.slot()],
        QueryState::Failing { error: GpuReadError::Failed("GPU lost"), ticks: 4 }
    );
}

#[test]
fn a_zero_memory_total_leaves_the_percentage_out() {
    let mut script = Script::two_gpus();
    script.answer(0, Query::Memory, &[Ok(Reading::Memory { used_bytes: 5, total_bytes: 0 })]);
    let m = tick(&mut GpuSampler::new(script));
    assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), None);
    assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some(5.0));
}

fn stats(count: u32, mean: f64, max: f64) -> SampleStats {
    SampleStats { count, mean, max, held: None, lost: 0, ..SampleStats::default() }
}

/// The sampler over `source` with every query on every tick (the tests of what a query
/// gives; the cadence has its own).
fn every_tick<S: GpuSource>(source: S) -> GpuSampler<S> {
    GpuSampler::new(source).with_cadence(Cadence::EVERY_TICK)
}

#[test]
fn the_sample_buffer_gives_the_interval_mean_and_max_else_the_instant_reading() {
    let mut script = Script::two_gpus();
    script.answer(
        0,
        Query::UtilizationSamples,
        &[
            Ok(Reading::UtilizationSamples { gpu: stats(6, 55.5, 99.0), memory_busy: stats(6, 20.0, 35.0) }),
            // No GPU sample this interval: the instant reading stands in, without a max.
            Ok(Reading::UtilizationSamples { gpu: stats(0, 0.0, 0.0), memory_busy: stats(2, 10.0, 12.0) }),
            Ok(Reading::UtilizationSamples { gpu: stats(1, 7.0, 7.0), memory_busy: stats(1, 3.0, 3.0) }),
        ],
    );
    let mut s = every_tick(script);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(55.5));
    assert_eq!(get(&m, 0, GPU_BUSY_MAX_PERCENT), Some(99.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_PERCENT), Some(20.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_MAX_PERCENT), Some(35.0));
    assert_eq!(get(&m, 0, GPU_BUSY_MEAN_PERCENT), Some(55.5));
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_MEAN_PERCENT), Some(20.0));
    // gpu1 has no buffer: the instant reading, no max.
    assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(91.0));
    assert_eq!(get(&m, 1, GPU_BUSY_MAX_PERCENT), None);
    assert_eq!(s.source.calls(0, Query::Utilization), 0, "not asked when the buffer answered");
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(90.0));
    assert_eq!(get(&m, 0, GPU_BUSY_MAX_PERCENT), None);
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_PERCENT), Some(10.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_MAX_PERCENT), Some(12.0));
    assert_eq!(s.source.calls(0, Query::Utilization), 1);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(7.0));
    assert_eq!(s.source.calls(0, Query::Utilization), 1);
    assert_eq!(s.source.calls(1, Query::UtilizationSamples), 1, "switched off on gpu1");
    assert_eq!(s.source.calls(1, Query::Utilization), 3);
}

#[test]
fn throttle_reasons_give_the_mask_and_one_row_per_active_reason() {
    let mut script = Script::two_gpus();
    script.answer(0, Query::Throttle, &[Ok(Reading::Throttle(0x44)), Ok(Reading::Throttle(0))]);
    let mut s = GpuSampler::new(script).with_cadence(SECOND_EVERY_TICK);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_THROTTLE_MASK), Some(68.0));
    assert_eq!(get(&m, 0, "ThrottleSwPowerCap"), Some(1.0));
    assert_eq!(get(&m, 0, "ThrottleHwThermal"), Some(1.0));
    let active: Vec<_> = m.as_slice().iter().filter(|x| x.dimension.starts_with("Throttle")).collect();
    assert_eq!(active.len(), 3);
    assert_eq!(get(&m, 1, GPU_THROTTLE_MASK), None, "not supported on gpu1");
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_THROTTLE_MASK), Some(0.0));
    assert_eq!(get(&m, 0, "ThrottleSwPowerCap"), None);
}

fn fields(pcie_tx: u64, nvlink_rx_kib: u64, energy_mj: u64) -> Reading {
    let mut v: FieldValues = [Err(NS); Field::ALL.len()];
    v[Field::PcieTxBytes.slot()] = Ok(pcie_tx);
    v[Field::PcieRxBytes.slot()] = Err(GpuReadError::Failed("unknown"));
    v[Field::NvlinkRxKib.slot()] = Ok(nvlink_rx_kib);
    v[Field::PowerInstantMilliwatts.slot()] = Ok(215_000);
    v[Field::EnergyMillijoules.slot()] = Ok(energy_mj);
    v[Field::EccCorrectedVolatile.slot()] = Ok(2);
    v[Field::EccUncorrectedAggregate.slot()] = Ok(1);
    Reading::Fields(v)
}

#[test]
fn fields_give_rates_over_the_interval_and_each_is_switched_off_alone() {
    let mut script = Script::two_gpus();
    script.answer(
        0,
        Query::Fields,
        &[Ok(fields(1_000, 10, 100_000)), Ok(fields(501_000, 20, 150_000)), Ok(fields(400, 20, 150_000))],
    );
    script.answer(0, Query::InstantFields, &[Ok(fields(0, 0, 0))]);
    let all_off: FieldValues = [Err(NS); Field::ALL.len()];
    script.answer(1, Query::Fields, &[Ok(Reading::Fields(all_off))]);
    script.answer(1, Query::InstantFields, &[Ok(Reading::Fields(all_off))]);
    let mut s = every_tick(script);
    let m = tick_at(&mut s, Duration::from_secs(10));
    // A rate needs two readings; the rest is there at once.
    assert_eq!(get(&m, 0, "PcieTxBytesPerSecond"), None);
    assert_eq!(get(&m, 0, "PowerInstantWatts"), Some(215.0));
    assert_eq!(get(&m, 0, "EccCorrectedVolatile"), Some(2.0));
    assert_eq!(get(&m, 0, "EccUncorrectedAggregate"), Some(1.0));
    assert_eq!(s.failures(), 1, "PCIe RX failed");
    let m = tick_at(&mut s, Duration::from_millis(10_500));
    assert_eq!(get(&m, 0, "PcieTxBytesPerSecond"), Some(1_000_000.0));
    assert_eq!(get(&m, 0, "NvlinkRxBytesPerSecond"), Some(20_480.0));
    assert_eq!(get(&m, 0, "EnergyMeanWatts"), Some(100.0));
    assert_eq!(get(&m, 0, "PcieRxBytesPerSecond"), None);
    assert_eq!(get(&m, 0, "NvlinkTxBytesPerSecond"), None);
    // A counter that went back (a driver reload) gives 0, not a huge number.
    let m = tick_at(&mut s, Duration::from_secs(11));
    assert_eq!(get(&m, 0, "PcieTxBytesPerSecond"), Some(0.0));
    assert_eq!(s.failures(), 3);
    let off: Vec<Field> = s.fields_off(0).collect();
    assert!(off.contains(&Field::NvlinkTxKib) && off.contains(&Field::EccCorrectedAggregate), "{off:?}");
    assert!(!off.contains(&Field::PcieRxBytes), "transient, asked again");
    assert!(!s.switched_off(0).any(|q| q == Query::Fields));
    // gpu1 supports none: both batches are switched off after one call each.
    assert_eq!(s.fields_off(1).count(), Field::ALL.len());
    assert!(s.switched_off(1).any(|q| q == Query::Fields));
    assert!(s.switched_off(1).any(|q| q == Query::InstantFields));
    assert_eq!(s.source.calls(1, Query::Fields), 1);
    assert_eq!(s.source.calls(1, Query::InstantFields), 1);
    assert_eq!(s.source.calls(0, Query::Fields), 3);
}

#[test]
fn gpm_needs_two_samples_and_switches_off_per_metric() {
    let mut script = Script::two_gpus();
    let v: GpmValues = [Ok(61.5), Ok(33.25), Err(NS), Ok(12.5)];
    script.answer(0, Query::Gpm, &[Ok(Reading::Gpm(None)), Ok(Reading::Gpm(Some(v)))]);
    let mut s = every_tick(script);
    let m = tick(&mut s);
    assert!(GpmMetric::ALL.iter().all(|g| get(&m, 0, g.dimension()).is_none()));
    for _ in 0..2 {
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, "SmActivePercent"), Some(61.5));
        assert_eq!(get(&m, 0, "SmOccupancyPercent"), Some(33.25));
        assert_eq!(get(&m, 0, "TensorActivePercent"), None);
        assert_eq!(get(&m, 0, "DramActivePercent"), Some(12.5));
    }
    assert_eq!(s.gpus[0].gpm[GpmMetric::TensorActive.slot()], QueryState::Off);
    assert_eq!(s.source.calls(0, Query::Gpm), 3);
    assert_eq!(s.source.calls(1, Query::Gpm), 1, "not supported on gpu1");
    assert_eq!(s.failures(), 0);
}

fn samples(held_s: Option<u64>, lost: u64) -> Reading {
    let held = held_s.map(|s| s * 1_000_000);
    Reading::UtilizationSamples {
        gpu: SampleStats { count: 5, mean: 50.0, max: 60.0, held, lost, ..SampleStats::default() },
        memory_busy: SampleStats { count: 5, mean: 10.0, max: 20.0, held, lost, ..SampleStats::default() },
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// One GPU, ticks of 100 ms for 125 s, the default cadence, then the last tick.
#[test]
fn slow_queries_run_at_their_cadence_and_their_rows_cover_the_interval() {
    let mut script = Script::two_gpus();
    script.gpus = vec![0];
    // The counters grow by 1 MB of PCIe and 1 kJ between two reads, whenever they come.
    let reads: Vec<_> = (0..10).map(|k| Ok(fields(k * 1_000_000, 0, k * 1_000_000))).collect();
    script.answer(0, Query::Fields, &reads);
    script.answer(0, Query::InstantFields, &[Ok(fields(0, 0, 0))]);
    // The probe's read showed a ring of 14 s.
    script.answer(0, Query::UtilizationSamples, &[Ok(samples(Some(14), 0)), Ok(samples(None, 0))]);
    let mut s = GpuSampler::new(script);
    let (mut counter_reads, mut buffer_reads, mut rates, mut energy) = (vec![], vec![], vec![], vec![]);
    let mut second_reads = vec![];
    for k in 0..=1250 {
        let now = ms(100 * k);
        let m = tick_at(&mut s, now);
        if get(&m, 0, "EccCorrectedVolatile").is_some() {
            counter_reads.push(now);
        }
        if let Some(v) = get(&m, 0, "PcieTxBytesPerSecond") {
            rates.push(v);
            energy.push(get(&m, 0, "EnergyMeanWatts").unwrap());
        }
        if get(&m, 0, GPU_BUSY_MAX_PERCENT).is_some() {
            assert_eq!(get(&m, 0, GPU_BUSY_MEAN_PERCENT), Some(50.0));
            assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_MAX_PERCENT), Some(20.0));
            buffer_reads.push(now);
        }
        // The instant readings every tick; the buffers' mean stands for the first tick only
        // (its interval is the tick's: from the probe). The temperature once a second.
        let util = if k == 0 { 50.0 } else { 90.0 };
        assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(util), "{now:?}");
        let temperature = get(&m, 0, GPU_TEMPERATURE_CELSIUS);
        if temperature.is_some() {
            assert_eq!(temperature, Some(60.0));
            second_reads.push(now);
        }
        assert_eq!(get(&m, 0, "PowerInstantWatts"), Some(215.0));
    }
    // Counters on the first tick, then on the last tick before 60 s have passed.
    assert_eq!(counter_reads, [ms(0), ms(60_000), ms(119_900)]);
    // Each rate is the growth over the time since the previous read.
    assert_eq!(rates.len(), 2);
    assert!(close(Some(rates[0]), 1e6 / 60.0) && close(Some(rates[1]), 1e6 / 59.9), "{rates:?}");
    assert!(close(Some(energy[1]), 1e3 / 59.9), "{energy:?}");
    // Buffers every three quarters of the 14 s the ring holds: at 10.5 s, then on the last
    // tick before another 10.5 s have passed.
    let want: Vec<Duration> =
        std::iter::once(ms(0)).chain((0..12).map(|j| ms(10_500 + 10_400 * j))).collect();
    assert_eq!(buffer_reads, want);
    assert_eq!(s.buffer_state(0), Some((ms(10_500), 65, 0)));
    assert_eq!(s.source.calls(0, Query::Utilization), 1250, "not on the first tick");
    assert_eq!(s.source.calls(0, Query::Memory), 1251);
    // The once-a-second readings: on the first tick, then on the last tick before a second
    // has passed since the previous read (the second read: the tick is known from then on).
    assert_eq!(second_reads.len(), 139, "{second_reads:?}");
    assert_eq!(&second_reads[..4], [ms(0), ms(1_000), ms(1_900), ms(2_800)]);
    assert_eq!(s.source.calls(0, Query::Temperature), 139);
    assert_eq!(s.source.calls(0, Query::Power), 139);

    // The last tick reads what is not due, so that the totals reach the end.
    let mut m = Metrics::new();
    s.sample_last(ms(125_050), &mut m).unwrap();
    assert!(close(get(&m, 0, "PcieTxBytesPerSecond"), 1e6 / 5.15));
    assert_eq!(get(&m, 0, GPU_BUSY_MAX_PERCENT), Some(60.0));
    assert_eq!(s.source.calls(0, Query::Fields), 4);
}

#[test]
fn lost_samples_make_the_buffers_read_sooner_within_the_bounds() {
    let mut script = Script::two_gpus();
    script.gpus = vec![0];
    script.answer(
        0,
        Query::UtilizationSamples,
        &[Ok(samples(Some(14), 0)), Ok(samples(Some(4), 12)), Ok(samples(Some(1), 3)), Ok(samples(None, 0))],
    );
    let mut s = GpuSampler::new(script);
    tick_at(&mut s, ms(0));
    assert_eq!(s.buffer_state(0), Some((ms(10_500), 5, 0)));
    tick_at(&mut s, ms(10_400));
    assert_eq!(s.source.calls(0, Query::UtilizationSamples), 1, "not due");
    tick_at(&mut s, ms(10_500));
    assert_eq!(s.buffer_state(0), Some((ms(3_000), 10, 12)), "three quarters of the 4 s it held");
    tick_at(&mut s, ms(13_500));
    assert_eq!(s.buffer_state(0), Some((ms(1_000), 15, 15)), "never below the lower bound");
    tick_at(&mut s, ms(14_500));
    assert_eq!(s.buffer_state(0), Some((ms(1_000), 20, 15)), "the span seen last holds");
}

#[test]
fn the_gpus_slow_calls_fall_on_different_ticks() {
    let mut script = Script::two_gpus();
    script.gpus = (0..8).collect();
    for i in 0..8 {
        script.answer(i, Query::Fields, &[Ok(fields(0, 0, 0))]);
        script.answer(i, Query::UtilizationSamples, &[Ok(samples(Some(14), 0)), Ok(samples(None, 0))]);
    }
    let mut s = GpuSampler::new(script);
    let count = |s: &GpuSampler<Script>, q| (0..8).map(|i| s.source.calls(i, q)).sum::<usize>();
    let mut last_read = [Duration::ZERO; 8];
    for k in 0..=1800 {
        let now = ms(100 * k);
        let (fields_before, buffers_before) =
            (count(&s, Query::Fields), count(&s, Query::UtilizationSamples));
        let m = tick_at(&mut s, now);
        let fields = count(&s, Query::Fields) - fields_before;
        let buffers = count(&s, Query::UtilizationSamples) - buffers_before;
        if k == 0 {
            assert_eq!((fields, buffers), (8, 8), "every query on the first tick");
            continue;
        }
        assert!(fields <= 1 && buffers <= 1, "{now:?}: {fields} counter and {buffers} buffer reads");
        for (i, at) in last_read.iter_mut().enumerate() {
            if get(&m, i as u32, "EccCorrectedVolatile").is_some() {
                assert!(now - *at <= ms(60_000), "gpu{i} at {now:?}");
                *at = now;
            }
        }
    }
    assert_eq!(count(&s, Query::Fields), 8 + 8 * 3, "three more reads each in 180 s");
}

fn processes_script() -> Script {
    let mut script = Script::two_gpus();
    let mem = |pid, mib: u64| ProcessMemory { pid, used_bytes: Some(mib << 20) };
    let busy = |pid, sm, m| ProcessBusy { pid, sm_percent: sm, memory_busy_percent: m };
    script.answer(
        0,
        Query::Processes,
        &[Ok(Reading::Processes(vec![mem(10, 100), mem(11, 300), mem(12, 50), mem(13, 10), mem(999, 1000)]))],
    );
    script.answer(
        0,
        Query::ProcessUtilization,
        &[Ok(Reading::ProcessUtilization(vec![
            busy(10, 40.0, 10.0),
            busy(11, 20.0, 5.0),
            busy(13, 1.0, 0.0),
            busy(999, 30.0, 3.0),
        ]))],
    );
    script.answer(1, Query::Processes, &[Err(GpuReadError::Failed("unknown"))]);
    script
}

#[test]
fn the_trainer_trees_processes_are_attributed_per_gpu() {
    let tree = TreePids::default();
    tree.publish(&[13, 12, 11, 10, 1]);
    let mut s = every_tick(processes_script()).with_tree(tree.clone(), PidNamespace::Host);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, TRAINER_PROCESSES), Some(4.0));
    assert_eq!(get(&m, 0, TRAINER_MEM_USED_BYTES), Some((460u64 << 20) as f64));
    assert_eq!(get(&m, 0, TRAINER_SM_BUSY_PERCENT), Some(61.0));
    assert_eq!(get(&m, 0, TRAINER_MEMORY_BUSY_PERCENT), Some(15.0));
    // The busiest three, by SM busy.
    assert_eq!(get(&m, 0, "TopProcess1Pid"), Some(10.0));
    assert_eq!(get(&m, 0, "TopProcess1MemUsedBytes"), Some((100u64 << 20) as f64));
    assert_eq!(get(&m, 0, "TopProcess1SmBusyPercent"), Some(40.0));
    assert_eq!(get(&m, 0, "TopProcess2Pid"), Some(11.0));
    assert_eq!(get(&m, 0, "TopProcess3Pid"), Some(13.0));
    // The host namespace: pid 999 is someone else's, not unattributed.
    assert_eq!(get(&m, 0, UNATTRIBUTED_PROCESSES), None);
    // gpu1: memory failed (counted), utilisation not supported: no process rows.
    assert_eq!(get(&m, 1, TRAINER_PROCESSES), None);
    assert_eq!(s.failures(), 1);
    // The tree is read again each tick.
    tree.publish(&[999]);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, TRAINER_PROCESSES), Some(1.0));
    assert_eq!(get(&m, 0, TRAINER_SM_BUSY_PERCENT), Some(30.0));
    assert_eq!(get(&m, 0, "TopProcess1Pid"), Some(999.0));
    assert_eq!(get(&m, 0, "TopProcess2Pid"), None);
}

#[test]
fn in_a_child_pid_namespace_the_rest_is_unattributed() {
    let tree = TreePids::default();
    tree.publish(&[10, 11]);
    let mut s = GpuSampler::new(processes_script()).with_tree(tree, PidNamespace::Child);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, TRAINER_PROCESSES), Some(2.0));
    assert_eq!(get(&m, 0, UNATTRIBUTED_PROCESSES), Some(3.0));
    assert_eq!(get(&m, 0, UNATTRIBUTED_MEM_USED_BYTES), Some((1060u64 << 20) as f64));
    assert_eq!(get(&m, 0, UNATTRIBUTED_SM_BUSY_PERCENT), Some(31.0));
}

#[test]
fn an_xid_event_is_logged_once_and_counted() {
    let mut script = Script::two_gpus();
    script.events_for = vec![0];
    script.events =
        VecDeque::from([vec![(0, GpuEvent::Xid(Some(79)))], vec![], vec![(0, GpuEvent::SingleBitEcc)]]);
    let mut s = GpuSampler::new(script);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_XID_EVENTS), Some(1.0));
    assert_eq!(get(&m, 0, GPU_ECC_SINGLE_BIT_EVENTS), Some(0.0));
    assert_eq!(get(&m, 0, GPU_ECC_DOUBLE_BIT_EVENTS), Some(0.0));
    // gpu1 has no events registered: no rows rather than zeroes that mean nothing.
    assert_eq!(get(&m, 1, GPU_XID_EVENTS), None);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_XID_EVENTS), Some(1.0), "counted once, kept");
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, GPU_ECC_SINGLE_BIT_EVENTS), Some(1.0));
    assert_eq!(s.event_counts(0), Some((1, 1, 0, 2)), "each event logged once");
}

#[test]
fn an_event_storm_is_counted_but_its_log_is_bounded() {
    let mut script = Script::two_gpus();
    script.events_for = vec![1];
    script.events =
        VecDeque::from([vec![(1, GpuEvent::DoubleBitEcc); 50], vec![(1, GpuEvent::Xid(None)); 50]]);
    let mut s = GpuSampler::new(script);
    tick(&mut s);
    let m = tick(&mut s);
    assert_eq!(get(&m, 1, GPU_ECC_DOUBLE_BIT_EVENTS), Some(50.0));
    assert_eq!(get(&m, 1, GPU_XID_EVENTS), Some(50.0));
    assert_eq!(s.event_counts(1), Some((50, 0, 50, MAX_EVENT_LOGS)));
}

#[test]
fn nvml_errors_are_sorted_into_switched_off_and_transient() {
    let off =
        [NvmlError::NotSupported, NvmlError::FunctionNotFound, NvmlError::FailedToLoadSymbol("x".into())];
    for e in off {
        assert!(matches!(GpuReadError::from_nvml(&e), GpuReadError::NotSupported(_)), "{e:?}");
    }
    let again = [NvmlError::Unknown, NvmlError::GpuLost, NvmlError::NoPermission, NvmlError::Timeout];
    for e in again {
        assert!(matches!(GpuReadError::from_nvml(&e), GpuReadError::Failed(_)), "{e:?}");
    }
}

#[test]
fn facts_read_as_one_line() {
    let f = GpuFacts {
        index: 1,
        name: Some("Tesla T4".into()),
        uuid: Some("GPU-1".into()),
        memory_total_bytes: Some(15 << 30),
        power_limit_watts: Some(70.0),
        events: true,
    };
    assert_eq!(f.to_string(), "gpu1 Tesla T4 (GPU-1, 15360 MiB, power limit 70 W)");
    let f = GpuFacts { index: 0, ..GpuFacts::default() };
    assert_eq!(f.to_string(), "gpu0 (name unknown) (uuid unknown, memory unknown, no power limit)");
}

/// Builds `tests/c/fake_nvml.c` with `defines` as `libnvidia-ml.so.1` in a folder of its
/// own (a loaded library is never unloaded, so each variant needs its own path), probes
/// it, and removes the folder (the mapped library stays usable). No `cc` is a failure,
/// not a skip.
fn build_fake(variant: &str, defines: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c/fake_nvml.c");
    let tmp = tempfile::Builder::new().prefix(&format!("trainprof-fake-nvml-{variant}-")).tempdir().unwrap();
    let lib = tmp.path().join("libnvidia-ml.so.1");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wall", "-Werror", "-O2", "-o"])
        .arg(&lib)
        .args(defines)
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cc (a C compiler is needed for this test): {e}"));
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    (tmp, lib)
}

fn probe_fake(variant: &str, defines: &[&str]) -> Option<GpuSampler<NvmlSource>> {
    let (_tmp, lib) = build_fake(variant, defines);
    probe(Some(lib.as_os_str())).unwrap()
}

#[test]
fn a_fake_nvml_library_is_loaded_enumerated_and_read() {
    let mut s = probe_fake("full", &["-DFAKE_NVML_SAMPLE_US=1000"]).expect("two fake GPUs");
    let facts = s.facts();
    assert_eq!(facts.len(), 2);
    assert_eq!(facts[0].name.as_deref(), Some("Fake GPU A"));
    assert_eq!(facts[0].uuid.as_deref(), Some("GPU-00000000-0000-0000-0000-00000000000a"));
    assert_eq!(facts[0].memory_total_bytes, Some(16 << 30));
    assert_eq!(facts[0].power_limit_watts, Some(300.0));
    assert!(facts[0].events);
    assert_eq!(facts[1].name.as_deref(), Some("Fake GPU B"));
    assert_eq!(facts[1].power_limit_watts, None);
    assert!(!facts[1].events);

    // Tick 1 (every query): gpu0's temperature fails once (NVML_ERROR_UNKNOWN), gpu1 has no
    // power. The fake's buffers take a sample each millisecond; the probe read them whole.
    std::thread::sleep(Duration::from_millis(20));
    let m = tick_at(&mut s, Duration::from_secs(1));
    // The buffers' samples since the probe: at least 16 of the cycle 50, 100, 80, 90.
    let mean = get(&m, 0, GPU_BUSY_MEAN_PERCENT).expect("the buffer's mean");
    assert!((70.0..=90.0).contains(&mean), "{mean}");
    assert_eq!(get(&m, 0, GPU_UTILIZATION), Some(mean), "the buffer's interval is the tick's");
    assert_eq!(get(&m, 0, GPU_BUSY_MAX_PERCENT), Some(100.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_BUSY_MAX_PERCENT), Some(60.0));
    assert_eq!(get(&m, 0, GPU_MEMORY_UTILIZATION), Some(25.0));
    assert_eq!(get(&m, 0, GPU_MEM_USED_BYTES), Some((4u64 << 30) as f64));
    assert_eq!(get(&m, 0, GPU_POWER_WATTS), Some(212.5));
    assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), None);
    assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), Some(1410.0));
    assert_eq!(get(&m, 0, GPU_THROTTLE_MASK), Some(68.0));
    assert_eq!(get(&m, 0, "ThrottleSwPowerCap"), Some(1.0));
    assert_eq!(get(&m, 0, "ThrottleHwThermal"), Some(1.0));
    assert_eq!(get(&m, 0, "PowerInstantWatts"), Some(215.0));
    assert_eq!(get(&m, 0, "EccCorrectedVolatile"), Some(2.0));
    assert_eq!(get(&m, 0, "EccUncorrectedVolatile"), Some(0.0));
    assert_eq!(get(&m, 0, "EccCorrectedAggregate"), Some(7.0));
    assert_eq!(get(&m, 0, "EccUncorrectedAggregate"), Some(1.0));
    assert_eq!(get(&m, 0, GPU_XID_EVENTS), Some(1.0), "the fake's Xid 79");
    assert_eq!(get(&m, 0, GPU_ECC_SINGLE_BIT_EVENTS), Some(0.0));
    // gpu1: the instant utilisation (no buffer), PCIe only.
    assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(3.0));
    assert_eq!(get(&m, 1, GPU_BUSY_MAX_PERCENT), None);
    assert_eq!(get(&m, 1, GPU_POWER_WATTS), None);
    assert_eq!(get(&m, 1, GPU_TEMPERATURE_CELSIUS), Some(35.0));
    assert_eq!(get(&m, 1, GPU_THROTTLE_MASK), Some(0.0));
    assert_eq!(get(&m, 1, "PowerInstantWatts"), None);
    assert_eq!(get(&m, 1, GPU_XID_EVENTS), None);
    assert_eq!(s.failures(), 1);
    assert_eq!(
        s.switched_off(1).collect::<Vec<_>>(),
        [Query::Power, Query::UtilizationSamples, Query::InstantFields, Query::Gpm]
    );
    assert_eq!(s.switched_off(0).count(), 0);
    let off1: Vec<Field> = s.fields_off(1).collect();
    assert!(!off1.contains(&Field::PcieTxBytes) && !off1.contains(&Field::PcieRxBytes));
    assert_eq!(off1.len(), Field::ALL.len() - 2);
    assert_eq!(s.fields_off(0).count(), 0, "NVLink asked with the all-links scope");
    // The probe's read showed the ring (70 samples, 69 ms): three quarters of it is below
    // the lower bound.
    assert_eq!(s.buffer_state(0).map(|b| b.0), Some(Duration::from_secs(1)));

    // Tick 2, 0.5 s later: gpu0's buffers are due (the GPUs share the first second), no
    // counter is. The buffers were read on the tick before: their mean is the tick's.
    std::thread::sleep(Duration::from_millis(5));
    let m = tick_at(&mut s, Duration::from_millis(1500));
    assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), None, "once a second: asked again at 2 s");
    assert!(get(&m, 0, GPU_BUSY_MAX_PERCENT).is_some());
    assert_eq!(get(&m, 0, GPU_UTILIZATION), get(&m, 0, GPU_BUSY_MEAN_PERCENT));
    assert_eq!(get(&m, 0, "PowerInstantWatts"), Some(215.0));
    for d in ["PcieTxBytesPerSecond", "EnergyMeanWatts", "EccCorrectedVolatile", "SmActivePercent"] {
        assert_eq!(get(&m, 0, d), None, "{d}: not due");
    }
    assert_eq!(get(&m, 0, GPU_ECC_SINGLE_BIT_EVENTS), Some(1.0), "events every tick");

    // 100 ms later nothing slow is due: the instant utilisation, no buffer rows.
    let m = tick_at(&mut s, Duration::from_millis(1600));
    let instant = get(&m, 0, GPU_UTILIZATION).expect("the instant utilisation");
    assert!([50.0, 100.0, 80.0, 90.0].contains(&instant), "{instant}: NVML's newest sample");
    assert_eq!(get(&m, 0, GPU_BUSY_MAX_PERCENT), None);
    assert_eq!(get(&m, 0, GPU_BUSY_MEAN_PERCENT), None);

    // Tick 3 at 31 s: gpu0's counters (half of 60 s after the first tick): rates over the
    // 30 s since the first tick's read, GPM between the two samples. gpu1's are due at 61 s.
    let m = tick_at(&mut s, Duration::from_secs(31));
    assert_eq!(get(&m, 0, GPU_TEMPERATURE_CELSIUS), Some(64.0), "read again after its failure");
    assert!(close(get(&m, 0, "PcieTxBytesPerSecond"), 1e6 / 30.0));
    assert!(close(get(&m, 0, "PcieRxBytesPerSecond"), 2e6 / 30.0));
    assert!(close(get(&m, 0, "NvlinkTxBytesPerSecond"), 1000.0 * 1024.0 / 30.0));
    assert!(close(get(&m, 0, "NvlinkRxBytesPerSecond"), 3000.0 * 1024.0 / 30.0));
    assert!(close(get(&m, 0, "EnergyMeanWatts"), 21.25 / 30.0));
    assert_eq!(get(&m, 0, "EccCorrectedVolatile"), Some(2.0));
    assert_eq!(get(&m, 0, "SmActivePercent"), Some(61.5));
    assert_eq!(get(&m, 0, "SmOccupancyPercent"), Some(33.25));
    assert_eq!(get(&m, 0, "TensorActivePercent"), Some(44.0));
    assert_eq!(get(&m, 0, "DramActivePercent"), Some(12.5));
    assert_eq!(get(&m, 1, "PcieRxBytesPerSecond"), None);
    assert_eq!(s.failures(), 1);
    assert_eq!(s.event_counts(0), Some((1, 1, 0, 2)));

    // Tick 4 at 61 s: gpu1's counters (60 s after its first), not gpu0's.
    let m = tick_at(&mut s, Duration::from_secs(61));
    assert!(close(get(&m, 1, "PcieRxBytesPerSecond"), 2e6 / 60.0));
    assert_eq!(get(&m, 0, "PcieRxBytesPerSecond"), None);

    // The last tick reads everything: the older GPM sample is filled again (the fake
    // refuses a pair out of order), the rates cover the 31 s since gpu0's previous read.
    std::thread::sleep(Duration::from_millis(5));
    let mut m = Metrics::new();
    s.sample_last(Duration::from_secs(62), &mut m).unwrap();
    assert_eq!(get(&m, 0, "SmActivePercent"), Some(61.5));
    assert!(close(get(&m, 0, "PcieTxBytesPerSecond"), 1e6 / 31.0));
    assert!(close(get(&m, 1, "PcieTxBytesPerSecond"), 1e6));
    assert!(get(&m, 0, GPU_BUSY_MEAN_PERCENT).is_some());
    assert_eq!(s.failures(), 1);
}

/// A real read of the fake's buffers (100 samples a second, a ring of 50: 490 ms), ticks of
/// 20 ms for about 1.2 s: at the measured cadence (367.5 ms) no sample is lost; with a lower
/// bound above the ring's span, the loss is seen and counted.
#[test]
fn the_buffers_are_read_often_enough_to_lose_no_sample() {
    let (_tmp, lib) = build_fake("ring", &["-DFAKE_NVML_SAMPLE_US=10000", "-DFAKE_NVML_RING=50"]);
    let run = |min_ms: u64| {
        let cadence = Cadence {
            counters: Duration::from_secs(10),
            buffers_min: Duration::from_millis(min_ms),
            buffers_max: Duration::from_secs(10),
            second: Duration::from_secs(1),
            utilization_per_sample: true,
        };
        let mut s = probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_cadence(cadence);
        let start = std::time::Instant::now();
        let mut reads = 0;
        let mut ticks = 0;
        while start.elapsed() < Duration::from_millis(1200) {
            let m = tick_at(&mut s, start.elapsed());
            reads += usize::from(get(&m, 0, GPU_BUSY_MAX_PERCENT).is_some());
            ticks += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut m = Metrics::new();
        s.sample_last(start.elapsed(), &mut m).unwrap();
        let (every, read, lost) = s.buffer_state(0).unwrap();
        (every, read, lost, reads, ticks, start.elapsed())
    };
    let (every, read, lost, reads, ticks, took) = run(10);
    assert_eq!(every, Duration::from_micros(367_500), "three quarters of the span the probe saw");
    assert_eq!(lost, 0);
    // Every sample since the probe (one each 10 ms), give or take the edges.
    let made = took.as_millis() as u64 / 10;
    assert!(read + 2 >= made && read <= made + 2, "{read} of {made}");
    assert!(reads < ticks / 2, "{reads} reads in {ticks} ticks");

    let (every, read, lost, _, _, took) = run(700);
    assert_eq!(every, Duration::from_millis(700), "the lower bound");
    assert!(lost > 0, "the gaps are seen");
    let made = took.as_millis() as u64 / 10;
    assert!(read + lost + 3 >= made && read + lost <= made + 3, "{read} + {lost} of {made}");
}

/// The buffers read at their cadence (three quarters of the ring's span) give the same
/// samples as the buffers read on every tick: two samplers over the fake's buffers (50 samples
/// a second, a ring of 25: 480 ms), one reading every 20 ms tick, the other at the default
/// cadence's rule, side by side on the same ticks for 1.5 s and the last tick. Both count every
/// sample once, with the same values (their sum and maximum), give or take one sample at each
/// end (the two probes and the two last ticks are a few µs apart).
#[test]
fn the_buffers_at_their_cadence_lose_no_sample_against_reading_every_tick() {
    let (_tmp, lib) = build_fake("whole", &["-DFAKE_NVML_SAMPLE_US=20000", "-DFAKE_NVML_RING=25"]);
    let slow_cadence = Cadence { buffers_min: Duration::from_millis(10), ..Cadence::DEFAULT };
    let mut every =
        probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_cadence(Cadence::EVERY_TICK);
    let mut slow = probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_cadence(slow_cadence);
    // Per sampler: samples, their sum (the mean of a read × its count), their maximum, reads.
    #[derive(Default, Debug)]
    struct Seen {
        samples: u64,
        sum: f64,
        max: f64,
        reads: u64,
    }
    fn seen<S: GpuSource>(s: &mut GpuSampler<S>, now: Duration, last: bool, acc: &mut Seen) {
        let before = s.buffer_state(0).unwrap().1;
        let mut m = Metrics::new();
        if last {
            s.sample_last(now, &mut m).unwrap();
        } else {
            s.sample(now, &mut m).unwrap();
        }
        let n = s.buffer_state(0).unwrap().1 - before;
        if let Some(mean) = get(&m, 0, GPU_BUSY_MEAN_PERCENT) {
            acc.reads += 1;
            acc.samples += n;
            acc.sum += mean * n as f64;
            acc.max = acc.max.max(get(&m, 0, GPU_BUSY_MAX_PERCENT).unwrap());
        }
    }
    let (mut a, mut b) = (Seen::default(), Seen::default());
    let start = std::time::Instant::now();
    let mut ticks = 0;
    while start.elapsed() < Duration::from_millis(1500) {
        let now = start.elapsed();
        seen(&mut every, now, false, &mut a);
        seen(&mut slow, now, false, &mut b);
        ticks += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let now = start.elapsed();
    seen(&mut every, now, true, &mut a);
    seen(&mut slow, now, true, &mut b);
    let (slow_every, _, slow_lost) = slow.buffer_state(0).unwrap();
    assert_eq!(slow_every, Duration::from_millis(360), "three quarters of the 480 ms ring");
    assert_eq!(slow_lost, 0, "{b:?}");
    assert!(b.reads >= 4 && b.reads * 4 < ticks, "{} reads in {ticks} ticks", b.reads);
    // About 75 samples made in 1.5 s; each counted once by both.
    assert!(a.samples >= 60, "{a:?}");
    assert!(a.samples.abs_diff(b.samples) <= 2, "every tick {a:?}, at the cadence {b:?}");
    assert!((a.sum - b.sum).abs() <= 200.0, "every tick {a:?}, at the cadence {b:?}");
    assert_eq!((a.max, b.max), (100.0, 100.0));
}

#[test]
fn a_process_list_larger_than_the_first_guess_is_read_whole() {
    let (_tmp, lib) = build_fake("many-processes", &["-DFAKE_NVML_MANY_PROCESSES"]);
    let tree = TreePids::default();
    tree.publish(&[101, 5099]);
    let mut s = probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_tree(tree, PidNamespace::Host);
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, TRAINER_PROCESSES), Some(2.0));
    assert_eq!(get(&m, 0, TRAINER_MEM_USED_BYTES), Some(((1u64 << 30) + (1 << 20)) as f64));
    assert_eq!(s.failures(), 1, "only the fake's first temperature read");
}

#[test]
fn the_fake_librarys_processes_are_attributed() {
    let (_tmp, lib) = build_fake("processes", &["-DFAKE_NVML_SAMPLE_US=1000"]);
    let tree = TreePids::default();
    tree.publish(&[202, 101, 7]);
    let mut s = probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_tree(tree, PidNamespace::Host);
    std::thread::sleep(Duration::from_millis(5));
    let m = tick(&mut s);
    assert_eq!(get(&m, 0, TRAINER_PROCESSES), Some(2.0));
    assert_eq!(get(&m, 0, TRAINER_MEM_USED_BYTES), Some((3u64 << 30) as f64));
    // pid 101's SM is 60, 202's 50; memory 20, 15. The sum (110) is capped at the whole GPU.
    assert_eq!(get(&m, 0, TRAINER_SM_BUSY_PERCENT), Some(100.0));
    assert_eq!(get(&m, 0, TRAINER_MEMORY_BUSY_PERCENT), Some(35.0));
    assert_eq!(get(&m, 0, "TopProcess1Pid"), Some(101.0));
    assert_eq!(get(&m, 0, "TopProcess1SmBusyPercent"), Some(60.0));
    assert_eq!(get(&m, 0, "TopProcess2Pid"), Some(202.0));
    assert_eq!(get(&m, 0, "TopProcess2MemUsedBytes"), Some((2u64 << 30) as f64));
    assert_eq!(get(&m, 0, UNATTRIBUTED_PROCESSES), None);
    // gpu1: no compute process, utilisation per process not supported.
    assert_eq!(get(&m, 1, TRAINER_PROCESSES), Some(0.0));
    assert_eq!(get(&m, 1, TRAINER_MEM_USED_BYTES), Some(0.0));
    assert_eq!(get(&m, 1, TRAINER_SM_BUSY_PERCENT), None);
    assert!(s.switched_off(1).any(|q| q == Query::ProcessUtilization));
}

#[test]
fn a_function_missing_from_the_library_switches_its_field_off() {
    let mut s = probe_fake("no-clock", &["-DFAKE_NVML_NO_CLOCK"]).expect("two fake GPUs");
    for _ in 0..2 {
        let m = tick(&mut s);
        assert_eq!(get(&m, 0, GPU_SM_CLOCK_MHZ), None);
        assert_eq!(get(&m, 1, GPU_SM_CLOCK_MHZ), None);
        assert_eq!(get(&m, 1, GPU_UTILIZATION), Some(3.0));
    }
    assert_eq!(s.switched_off(0).collect::<Vec<_>>(), [Query::SmClock]);
    assert!(s.switched_off(1).any(|q| q == Query::SmClock));
}

#[test]
fn no_library_no_driver_or_no_gpu_is_no_sampler() {
    let tmp = tempfile::tempdir().unwrap();
    let absent = tmp.path().join("no-such-dir/libnvidia-ml.so.1");
    assert!(probe(Some(absent.as_os_str())).unwrap().is_none());
    assert!(probe_fake("no-driver", &["-DFAKE_NVML_INIT_RESULT=9"]).is_none());
    assert!(probe_fake("no-gpus", &["-DFAKE_NVML_DEVICES=0"]).is_none());
}

/// The cost of one tick over the fake library with 1, 2, 4 and 8 GPUs (gpu1 is the fake's
/// limited one), every query answering (a trainer tree with two processes per GPU), at a
/// 100 ms cadence, side by side in one run: the sampling thread's CPU time
/// per tick and per GPU, and the NVML calls per tick (counted by the fake). Not a test: run
/// by hand, see `BENCHMARKS.md`, "NVML cost".
#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn bench_nvml_cost() {
    let ticks: u32 = std::env::var("TRAINPROF_BENCH_TICKS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    // 0: back to back, with warm caches (a floor for the per-tick work itself).
    let interval_ms: u32 =
        std::env::var("TRAINPROF_BENCH_INTERVAL_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
    println!("{ticks} ticks every {interval_ms} ms");
    println!(
        "| GPUs | CPU µs / tick | CPU µs / GPU / tick | NVML calls / tick | calls / GPU / tick | rows / tick | % of one core |"
    );
    println!("|---|---|---|---|---|---|---|");
    for gpus in [1u32, 2, 4, 8] {
        let define = format!("-DFAKE_NVML_DEVICES={gpus}");
        let (_tmp, lib) = build_fake(&format!("bench-{gpus}"), &[&define]);
        let tree = TreePids::default();
        tree.publish(&[101, 202, 1]);
        let mut s =
            probe(Some(lib.as_os_str())).unwrap().expect("fake GPUs").with_tree(tree, PidNamespace::Host);
        assert_eq!(s.facts().len(), gpus as usize);
        let calls = fake_call_counter(&lib);
        let start = std::time::Instant::now();
        let mut m = Metrics::new();
        let mut cpu = Duration::ZERO;
        let calls_before = calls();
        for k in 0..ticks {
            let before = thread_cpu();
            m.clear();
            s.sample(start.elapsed(), &mut m).unwrap();
            cpu += thread_cpu() - before;
            let next = Duration::from_millis(u64::from(interval_ms)) * (k + 1);
            std::thread::sleep(next.saturating_sub(start.elapsed()));
        }
        let per_tick_calls = (calls() - calls_before) as f64 / f64::from(ticks);
        let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(ticks);
        let n = f64::from(gpus);
        println!(
            "| {gpus} | {:.1} | {:.1} | {per_tick_calls:.1} | {:.1} | {} | {:.3} |",
            us(cpu),
            us(cpu) / n,
            per_tick_calls / n,
            m.len(),
            us(cpu) / 100_000.0 * 100.0, // of a 100 ms tick
        );
    }
}

/// The fake's `fake_nvml_call_count`, found in the already loaded library.
fn fake_call_counter(lib: &std::path::Path) -> impl Fn() -> u64 {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(lib.as_os_str().as_bytes()).unwrap();
    // SAFETY: the path is a NUL-terminated string; RTLD_NOLOAD only finds the copy that
    // nvml-wrapper loaded (never unloaded, see NvmlSource::open).
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "the fake library is not loaded");
    // SAFETY: a valid handle and a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c"fake_nvml_call_count".as_ptr()) };
    assert!(!sym.is_null());
    // SAFETY: the fake defines it as `unsigned long long fake_nvml_call_count(void)`.
    let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(sym) };
    move || f()
}

/// This thread's CPU time, to the nanosecond (`getrusage`'s per-thread split into user and
/// system time is sampled at the scheduler tick, too coarse for a few µs; the fake library
/// makes no system calls, so this is user-space time).
fn thread_cpu() -> Duration {
    Duration::from_nanos(crate::pipeline::sample::process::thread_cpu_ns())
}

/// The instant utilisation is read only when the driver has a new sample (its period seen in
/// the buffers): fewer calls than ticks, and every value written is what NVML gives at that
/// moment (a second sampler reading on every tick, just before and just after, agrees
/// whenever no sample fell between its two reads).
#[test]
fn the_instant_utilisation_is_read_once_per_driver_sample() {
    use crate::pipeline::cost::{self, Part};
    let account: &'static cost::Account = Box::leak(Box::default());
    cost::use_account(account);
    let calls = || account.snapshot().calls[Part::NvmlUtilization.slot()];
    let (_tmp, lib) = build_fake("per-sample", &["-DFAKE_NVML_SAMPLE_US=100000", "-DFAKE_NVML_DEVICES=1"]);
    let fast = Cadence { buffers_min: Duration::from_millis(200), ..Cadence::DEFAULT };
    let mut a = probe(Some(lib.as_os_str())).unwrap().expect("a fake GPU").with_cadence(fast);
    let every = Cadence { utilization_per_sample: false, ..fast };
    let mut b = probe(Some(lib.as_os_str())).unwrap().expect("a fake GPU").with_cadence(every);
    let start = std::time::Instant::now();
    let (mut ticks, mut checked, mut a_calls) = (0u64, 0u64, 0u64);
    while start.elapsed() < Duration::from_millis(2000) {
        let now = start.elapsed();
        let before = get(&tick_at(&mut b, now), 0, GPU_UTILIZATION);
        let c0 = calls();
        let value = get(&tick_at(&mut a, now), 0, GPU_UTILIZATION);
        a_calls += calls() - c0;
        let after = get(&tick_at(&mut b, now), 0, GPU_UTILIZATION);
        assert!(value.is_some(), "a value on every tick");
        if before == after {
            assert_eq!(value, before, "tick {ticks}: what NVML gives now");
            checked += 1;
        }
        ticks += 1;
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(checked * 2 >= ticks, "{checked} of {ticks} ticks checked");
    // 100 ms samples, ticks about 30 ms apart: about one read in three once the period is known.
    assert!(a_calls * 2 < ticks, "{a_calls} reads in {ticks} ticks");
}
