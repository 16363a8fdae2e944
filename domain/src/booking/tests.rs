//! Booking's rules tested: windows, what is free when, quotas, and properties over random bookings.
use super::*;
use crate::mig::{MigProfile, SliceRange};

const NOW: i64 = 1_800_000_000_000;
const H100: GpuModel = GpuModel::H100_80GB;
/// A soft tenant's booking, or one asking as a soft tenant.
const SOFT: Occupant = Occupant::Sharing;

/// Two H100 nodes of 2 GPUs.
fn gpus() -> Vec<GpuUnit> {
    h100_nodes(2)
}

/// `nodes` H100 nodes of 2 MIG-capable GPUs, GPU ids from 0.
fn h100_nodes(nodes: i64) -> Vec<GpuUnit> {
    (0..2 * nodes)
        .map(|i| GpuUnit {
            id: i,
            node_id: i / 2,
            model: H100,
            mig_capable: true,
            fabric: 0,
            time_slices: 1,
            nvlink_domain: None,
            ib_unit: 0,
        })
        .collect()
}

fn whole(gpu_id: i64, from_h: i64, to_h: i64) -> Booking {
    Booking {
        hold: Hold { gpu_id, slices: SliceRange::WHOLE_GPU, profile: None },
        window: Window { starts_at: NOW + from_h * HOUR_MS, ends_at: NOW + to_h * HOUR_MS },
        occupant: SOFT,
    }
}

fn at(from_h: i64, to_h: i64) -> Window {
    Window { starts_at: NOW + from_h * HOUR_MS, ends_at: NOW + to_h * HOUR_MS }
}

#[test]
fn starts_are_read_as_utc_and_bad_ones_explained() {
    assert_eq!(parse_start(""), Ok(None));
    assert_eq!(parse_start("2026-11-23T14:00"), Ok(Some(1_795_442_400_000)));
    assert_eq!(parse_start("2026-11-23T15:00+01:00"), Ok(Some(1_795_442_400_000)));
    let err = parse_start("tomorrow").expect_err("not a time");
    assert!(err.to_string().contains("like 2026-11-23T14:00"), "{err}");
}

#[test]
fn a_bad_end_is_called_an_end() {
    assert_eq!(parse_end("2026-11-23 14:00"), Ok(1_795_442_400_000));
    let err = parse_end("later").expect_err("not a time").to_string();
    assert!(err.starts_with("end \"later\" is not a date and time"), "{err}");
    assert!(parse_end(" ").expect_err("required").to_string().starts_with("end is required"));
}

#[test]
fn windows_follow_the_policy() {
    let p = BookingPolicy::default();
    assert_eq!(new_window(None, 2, NOW, &p), Ok(at(0, 2)));
    assert_eq!(new_window(Some(NOW - MINUTE_MS), 2, NOW, &p), Ok(at(0, 2)), "a minute ago is now");
    assert_eq!(new_window(Some(NOW - HOUR_MS), 2, NOW, &p), Err(Refusal::StartInPast));
    assert_eq!(new_window(Some(NOW + 89 * DAY_MS), 48, NOW, &p), Err(Refusal::BeyondHorizon { days: 90 }));
    assert_eq!(resized_window(at(0, 2), NOW + 4 * HOUR_MS, 24, NOW, &p), Ok(at(0, 4)));
    assert_eq!(resized_window(at(5, 7), NOW + 4 * HOUR_MS, 24, NOW, &p), Err(Refusal::EndNotAfterStart));
    assert_eq!(resized_window(at(0, 2), NOW + 30 * HOUR_MS, 24, NOW, &p), Err(Refusal::TooLong { max_hours: 24 }));
}

#[test]
fn the_cleaning_gap_keeps_back_to_back_bookings_apart() {
    let gap = 15 * MINUTE_MS;
    assert!(at(0, 2).conflicts(at(2, 4), gap));
    assert!(!at(0, 2).conflicts(at(2, 4), 0));
    assert!(!at(0, 2).conflicts(Window { starts_at: NOW + 2 * HOUR_MS + gap, ends_at: NOW + 5 * HOUR_MS }, gap));
}

#[test]
fn free_counts_and_the_heatmap_see_only_bookings_in_the_window() {
    let t = Timeline::new(gpus(), [whole(0, 0, 4), whole(1, 2, 6)], 0);
    let one = Shape::Gpus { model: H100, count: 1 };
    let two = Shape::Gpus { model: H100, count: 2 };
    let node = Shape::Nodes { model: H100, count: 1 };
    assert_eq!(t.free_count(one, at(0, 1), SOFT), 3);
    assert_eq!(t.free_count(two, at(0, 1), SOFT), 1, "only the second node has two free");
    assert_eq!(t.heatmaps(&[one], NOW, 2 * HOUR_MS, 4, SOFT)[0], vec![3, 2, 3, 4]);
    assert_eq!(t.heatmaps(&[node], NOW, 2 * HOUR_MS, 4, SOFT)[0], vec![1, 1, 1, 2]);
    let slice = Shape::MigSlice { model: H100, profile: MigProfile::G3 };
    assert_eq!(t.free_count(slice, at(0, 1), SOFT), 6, "two 3g on each free GPU");
}

#[test]
fn earliest_start_waits_for_the_cleaning_gap() {
    let gap = 15 * MINUTE_MS;
    let t = Timeline::new(gpus(), [whole(0, 0, 4), whole(1, 0, 6), whole(2, 0, 3), whole(3, 1, 8)], gap);
    let one = Shape::Gpus { model: H100, count: 1 };
    let two = Shape::Gpus { model: H100, count: 2 };
    let far = NOW + 30 * DAY_MS;
    assert_eq!(t.earliest_start(one, 2 * HOUR_MS, NOW, far, SOFT), Some(NOW + 3 * HOUR_MS + gap));
    assert_eq!(t.earliest_start(two, 2 * HOUR_MS, NOW, far, SOFT), Some(NOW + 6 * HOUR_MS + gap));
    assert_eq!(t.earliest_start(two, 2 * HOUR_MS, NOW, NOW + 7 * HOUR_MS, SOFT), None);
    // A 3-hour slot between bookings is too short for four hours.
    let gappy = Timeline::new(gpus()[..1].to_vec(), [whole(0, 0, 1), whole(0, 4, 10)], 0);
    assert_eq!(gappy.earliest_start(one, 3 * HOUR_MS, NOW, far, SOFT), Some(NOW + HOUR_MS));
    assert_eq!(gappy.earliest_start(one, 4 * HOUR_MS, NOW, far, SOFT), Some(NOW + 10 * HOUR_MS));
}

#[test]
fn shares_of_a_time_sliced_gpu_are_counted_and_found_over_time() {
    let mut shared = gpus();
    shared[0].time_slices = 4;
    let share = Shape::Share { model: H100, ways: 4 };
    let taken = |start: u8, from: i64, to: i64| Booking {
        hold: Hold { gpu_id: 0, slices: SliceRange { start, size: 2 }, profile: None },
        window: at(from, to),
        occupant: SOFT,
    };
    let t = Timeline::new(shared, [taken(0, 0, 4), taken(2, 0, 4), taken(4, 0, 4), taken(6, 0, 2)], 0);
    assert_eq!(t.free_count(share, at(0, 1), SOFT), 0);
    assert_eq!(t.free_count(share, at(2, 3), SOFT), 1);
    assert_eq!(t.free_count(share, at(5, 6), SOFT), 4);
    assert_eq!(t.earliest_start(share, 3 * HOUR_MS, NOW, NOW + DAY_MS, SOFT), Some(NOW + 2 * HOUR_MS));
    assert_eq!(t.free_count(Shape::Gpus { model: H100, count: 4 }, at(5, 6), SOFT), 0, "the shared GPU is not whole");
}

#[test]
fn placement_in_a_future_window_ignores_bookings_elsewhere_in_time() {
    let t = Timeline::new(gpus(), [whole(0, 0, 4), whole(1, 0, 4), whole(2, 0, 4), whole(3, 0, 4)], 0);
    let one = Shape::Gpus { model: H100, count: 1 };
    assert!(t.place(one, at(1, 2), SOFT).is_err());
    assert_eq!(t.place(one, at(4, 6), SOFT).map(|a| a.len()), Ok(1));
}

#[test]
fn quotas_are_read_from_a_form_with_empty_for_no_limit() {
    assert_eq!(
        Quota::parse("8", "", "", "48", " ", false),
        Ok(Quota { max_gpus: Some(8.0), max_booking_hours: Some(48), ..Quota::default() })
    );
    let err = Quota::parse("-1", "", "", "", "", false).expect_err("negative");
    assert_eq!(err.to_string(), "GPUs at once must be a number of GPU-equivalents, 0 or more, or empty for no limit");
    assert!(Quota::parse("", "", "", "0", "", false).is_err());
    assert!(Quota::parse("", "", "lots", "", "", false).is_err());
    let by_model = Quota::parse("2", "h100-80gb = 8, A100-80GB=16.5", "", "", "", false).expect("valid");
    assert_eq!(by_model.max_gpus_of(H100), Some(8.0));
    assert_eq!(by_model.max_gpus_of(GpuModel::A100_80GB), Some(16.5));
    assert_eq!(by_model.max_gpus_of(GpuModel::L40S), Some(2.0), "the others keep the general limit");
    for bad in ["H100-80GB", "V100 = 3", "H100-80GB = many", "H100-80GB = 1, H100-80GB = 2"] {
        assert!(Quota::parse("", bad, "", "", "", false).is_err(), "{bad}");
    }
}

#[test]
fn quota_refusals_say_which_limit_and_what_fits() {
    let you = QuotaScope::User;
    let quota = Quota { max_gpus: Some(4.0), ..Quota::default() };
    let usage = Usage { same_model: vec![(at(0, 2), 2.0), (at(2, 4), 3.0)], ..Usage::default() };
    assert_eq!(
        check_quota(&quota, &you, &usage, H100, at(0, 2), 2.0, Tier::Guaranteed),
        Ok(()),
        "back-to-back do not add up"
    );
    let err = check_quota(&quota, &you, &usage, H100, at(1, 3), 2.0, Tier::Guaranteed).expect_err("3 + 2 > 4");
    assert_eq!(
        err.to_string(),
        "quota: your limit is 4 H100-80GB GPU-equivalents at once; you hold up to 3 during this window and this booking asks for 2, so 1 more would fit: up to 1 x H100-80GB"
    );
    let acme = QuotaScope::Tenant("Acme".into());
    let err = check_quota(&quota, &acme, &usage, H100, at(1, 3), 2.0, Tier::Guaranteed).expect_err("tenant");
    assert_eq!(
        err.to_string(),
        "quota: tenant Acme's limit is 4 H100-80GB GPU-equivalents at once; it holds up to 3 during this window and this booking asks for 2, so 1 more would fit: up to 1 x H100-80GB"
    );
    // Exactly one is singular.
    let one = Quota { max_gpus: Some(1.0), ..Quota::default() };
    let err = check_quota(&one, &you, &Usage::default(), H100, at(0, 2), 2.0, Tier::Guaranteed).expect_err("2 > 1");
    assert!(err.to_string().starts_with("quota: your limit is 1 H100-80GB GPU-equivalent at once;"), "{err}");
    let monthly = Quota { gpu_hours_per_month: Some(100.0), ..Quota::default() };
    let used = Usage { gpu_hours_this_month: 90.0, ..Usage::default() };
    assert!(check_quota(&monthly, &you, &used, H100, at(0, 10), 1.0, Tier::Guaranteed).is_ok());
    let vision = QuotaScope::Project("vision".into());
    let err = check_quota(&monthly, &vision, &used, H100, at(0, 11), 1.0, Tier::Guaranteed).expect_err("hours");
    assert!(err.to_string().starts_with("quota: project vision's limit is 100 GPU-hours a month"), "{err}");
    let bursting = Quota { allow_spot: true, max_booking_hours: Some(8), ..monthly };
    assert_eq!(
        check_quota(&bursting, &you, &used, H100, at(0, 8), 4.0, Tier::Spot),
        Ok(()),
        "spot goes beyond GPU limits"
    );
    let err = check_quota(&bursting, &acme, &used, H100, at(0, 9), 1.0, Tier::Spot).expect_err("too long");
    assert_eq!(err.to_string(), "quota: bookings in tenant Acme are limited to 8 hours; this one is 9 hours");
    let g3 = Hold { gpu_id: 0, slices: SliceRange { start: 0, size: 4 }, profile: Some(MigProfile::G3) };
    assert!((gpu_equivalents(&[g3]) - 3.0 / 7.0).abs() < 1e-9);
}

/// Two soft tenants (or platform staff: the same to placement), two hard ones.
const OCCUPANTS: [Occupant; 4] = [SOFT, SOFT, Occupant::Dedicated(7), Occupant::Dedicated(8)];

/// Three H100 nodes of 2 GPUs: room for tenants to be kept apart.
fn three_nodes() -> Vec<GpuUnit> {
    h100_nodes(3)
}

const SHAPES: [Shape; 5] = [
    Shape::MigSlice { model: H100, profile: MigProfile::G1 },
    Shape::MigSlice { model: H100, profile: MigProfile::G3 },
    Shape::Gpus { model: H100, count: 1 },
    Shape::Gpus { model: H100, count: 2 },
    Shape::Nodes { model: H100, count: 1 },
];

/// Pairs of bookings on one node, in windows closer than the cleaning gap, whose
/// occupants may not share a node: checked from the bookings alone.
fn tenants_sharing_a_node(bookings: &[Booking], gpus: &[GpuUnit], gap: i64) -> usize {
    let node = |id: i64| gpus.iter().find(|g| g.id == id).map(|g| g.node_id);
    let mut pairs = 0;
    for (k, a) in bookings.iter().enumerate() {
        for b in &bookings[k + 1..] {
            if node(a.hold.gpu_id) == node(b.hold.gpu_id)
                && a.window.conflicts(b.window, gap)
                && a.occupant != b.occupant
                && (matches!(a.occupant, Occupant::Dedicated(_)) || matches!(b.occupant, Occupant::Dedicated(_)))
            {
                pairs += 1;
            }
        }
    }
    pairs
}

#[test]
fn hard_tenants_keep_their_nodes_and_go_to_their_own_first() {
    let hard = Occupant::Dedicated(7);
    let one = Shape::Gpus { model: H100, count: 1 };
    let booked = |gpu_id: i64, occupant: Occupant| Booking {
        hold: Hold { gpu_id, slices: SliceRange::WHOLE_GPU, profile: None },
        window: at(0, 4),
        occupant,
    };
    // A soft tenant on node 0, the hard tenant on node 1, node 2 empty.
    let t = Timeline::new(three_nodes(), [booked(0, SOFT), booked(2, hard)], 15 * MINUTE_MS);
    let placed = t.place(one, at(1, 2), hard).expect("fits");
    assert_eq!(placed[0].gpu_id, 3, "its own node first");
    let placed = t.place(one, at(1, 2), SOFT).expect("fits");
    assert_eq!(placed[0].gpu_id, 1, "a soft tenant fills the shared node and stays off the hard one");
    assert_eq!(t.free_count(one, at(1, 2), hard), 3, "its own node's GPU and the empty node's two");
    assert_eq!(t.free_count(one, at(1, 2), SOFT), 3, "the shared node's GPU and the empty node's two");
    assert_eq!(t.free_count(one, at(1, 2), Occupant::Dedicated(8)), 2, "another hard tenant: the empty node");
    // The cleaning gap holds between tenants on a node too.
    assert_eq!(t.earliest_start(one, HOUR_MS, NOW, NOW + DAY_MS, Occupant::Dedicated(8)), Some(NOW));
    let full = Timeline::new(
        three_nodes(),
        [booked(0, SOFT), booked(2, hard), booked(4, Occupant::Dedicated(8)), booked(5, Occupant::Dedicated(8))],
        15 * MINUTE_MS,
    );
    let err = full.place(one, at(1, 2), Occupant::Dedicated(8)).expect_err("its own node is full");
    let Refusal::NoCapacity { detail, .. } = err else { panic!("{err}") };
    assert!(detail.starts_with("no node is free of other tenants for it: 2 of the 3 H100-80GB nodes"), "{detail}");
    // A soft tenant whose own node is full waits for the hard tenants to leave theirs.
    let long = |gpu_id: i64| Booking { window: at(0, 8), ..booked(gpu_id, SOFT) };
    let soft_full = Timeline::new(
        three_nodes(),
        [long(0), long(1), booked(2, hard), booked(4, Occupant::Dedicated(8))],
        15 * MINUTE_MS,
    );
    let err = soft_full.place(one, at(1, 2), SOFT).expect_err("only hard tenants' nodes have room");
    assert!(err.to_string().contains("2 of the 3 H100-80GB nodes are dedicated to hard-isolated tenants"), "{err}");
    assert_eq!(
        soft_full.earliest_start(one, HOUR_MS, NOW, NOW + DAY_MS, SOFT),
        Some(NOW + 4 * HOUR_MS + 15 * MINUTE_MS),
        "when the hard tenants' bookings and the cleaning gap after them end"
    );
    // Maintenance keeps nobody off a node's other GPUs.
    let t = Timeline::new(three_nodes(), [booked(0, Occupant::Nobody)], 0);
    assert_eq!(t.place(one, at(1, 2), hard).map(|p| p[0].gpu_id), Ok(1));
}

proptest::proptest! {
    /// Random bookings of random shapes in random windows by soft and hard tenants:
    /// whatever the timeline accepts never conflicts with what it holds and never puts
    /// a hard tenant on a node with another tenant at the same time (cleaning gap
    /// included); what it counts as free for the asker can be placed, and an earliest
    /// start it finds can be placed.
    #[test]
    fn bookings_never_conflict_and_availability_agrees_with_placement(
        asks in proptest::collection::vec((0usize..5, 0usize..4, 0i64..48, 1i64..12), 1..40)
    ) {
        let gap = 15 * MINUTE_MS;
        let mut held: Vec<Booking> = Vec::new();
        for (shape, occupant, from, hours) in asks {
            let (shape, asker) = (SHAPES[shape], OCCUPANTS[occupant]);
            let window = at(from, from + hours);
            let timeline = Timeline::new(three_nodes(), held.clone(), gap);
            let free = timeline.free_count(shape, window, asker);
            match timeline.place(shape, window, asker) {
                Ok(assignments) => {
                    proptest::prop_assert!(free > 0);
                    for a in assignments {
                        for b in held.iter().filter(|b| b.hold.gpu_id == a.gpu_id) {
                            proptest::prop_assert!(
                                !b.hold.slices.overlaps(a.slices) || !b.window.conflicts(window, gap)
                            );
                        }
                        held.push(Booking { hold: a, window, occupant: asker });
                    }
                    proptest::prop_assert_eq!(tenants_sharing_a_node(&held, &three_nodes(), gap), 0);
                }
                Err(_) => {
                    proptest::prop_assert_eq!(free, 0);
                    let duration = hours * HOUR_MS;
                    let latest = NOW + 400 * HOUR_MS;
                    if let Some(t) = timeline.earliest_start(shape, duration, window.starts_at, latest, asker) {
                        proptest::prop_assert!(t > window.starts_at);
                        let later = Window { starts_at: t, ends_at: t + duration };
                        proptest::prop_assert!(timeline.place(shape, later, asker).is_ok());
                    }
                }
            }
        }
    }

    /// The heatmap counts each bucket for an asker as `free_count` does for that window
    /// alone, and that count is exactly how many bookings placement then takes for the
    /// same asker one after another, whoever else holds what.
    #[test]
    fn heatmap_buckets_count_what_placement_takes(
        held in proptest::collection::vec((0usize..5, 0usize..4, 0i64..48, 1i64..12), 0..30),
        asker in 0usize..4,
    ) {
        let gap = 15 * MINUTE_MS;
        let asker = OCCUPANTS[asker];
        let mut bookings: Vec<Booking> = Vec::new();
        for (shape, occupant, from, hours) in held {
            let (window, occupant) = (at(from, from + hours), OCCUPANTS[occupant]);
            let timeline = Timeline::new(three_nodes(), bookings.clone(), gap);
            if let Ok(assignments) = timeline.place(SHAPES[shape], window, occupant) {
                bookings.extend(assignments.into_iter().map(|hold| Booking { hold, window, occupant }));
            }
        }
        let timeline = Timeline::new(three_nodes(), bookings.clone(), gap);
        let rows = timeline.heatmaps(&SHAPES, NOW, 8 * HOUR_MS, 6, asker);
        for (shape, row) in SHAPES.iter().zip(&rows) {
            for (b, &free) in row.iter().enumerate() {
                let window = at(8 * b as i64, 8 * (b as i64 + 1));
                proptest::prop_assert_eq!(free, timeline.free_count(*shape, window, asker));
                let mut taken = bookings.clone();
                let mut placed = 0;
                while let Ok(assignments) = Timeline::new(three_nodes(), taken.clone(), gap).place(*shape, window, asker) {
                    taken.extend(assignments.into_iter().map(|hold| Booking { hold, window, occupant: asker }));
                    placed += 1;
                }
                proptest::prop_assert_eq!(free, placed, "{:?} in bucket {}", shape, b);
                proptest::prop_assert_eq!(tenants_sharing_a_node(&taken, &three_nodes(), gap), 0);
            }
        }
    }
}

proptest::proptest! {
    /// Where nobody is kept off a node, a timeline places during a window (reading its
    /// bookings where they are) exactly as placement does from a list of the GPUs and of
    /// what holds them during that window (the form the platform's booking book uses).
    #[test]
    fn a_timeline_places_as_the_list_of_its_holds_does(
        asks in proptest::collection::vec((0usize..5, 0i64..48, 1i64..12, proptest::bool::ANY), 1..40)
    ) {
        let gap = 15 * MINUTE_MS;
        let mut held: Vec<Booking> = Vec::new();
        for (shape, from, hours, maintenance) in asks {
            let shape = SHAPES[shape];
            let window = at(from, from + hours);
            let during: Vec<Hold> =
                held.iter().filter(|b| b.window.conflicts(window, gap)).map(|b| b.hold).collect();
            let timeline = Timeline::new(three_nodes(), held.clone(), gap);
            let placed = timeline.place(shape, window, SOFT);
            proptest::prop_assert_eq!(&placed, &placement::place(shape, &three_nodes(), &during));
            let occupant = if maintenance { Occupant::Nobody } else { SOFT };
            held.extend(placed.into_iter().flatten().map(|hold| Booking { hold, window, occupant }));
        }
    }
}

proptest::proptest! {
    /// A GPU's states over a row of windows, marked booking by booking where it holds only
    /// whole-GPU bookings, are each window's state read alone, at any window width and
    /// offset (bookings before, across and after the row, the cleaning gap at the edges).
    #[test]
    fn a_row_of_windows_reads_as_each_window_alone(
        asks in proptest::collection::vec((0usize..5, 0i64..96, 1i64..30), 0..30),
        // In quarter hours, as the bookings' hours and the gap are: windows meet them edge
        // to edge often.
        from_quarters in -40i64..200,
        width_quarters in 1i64..100,
        buckets in 0usize..20,
    ) {
        let gap = 15 * MINUTE_MS;
        let mut held: Vec<Booking> = Vec::new();
        for (shape, from, hours) in asks {
            let window = at(from, from + hours);
            if let Ok(placed) = Timeline::new(three_nodes(), held.clone(), gap).place(SHAPES[shape], window, SOFT) {
                held.extend(placed.into_iter().map(|hold| Booking { hold, window, occupant: SOFT }));
            }
        }
        let timeline = Timeline::new(three_nodes(), held, gap);
        let (from, width) = (NOW + from_quarters * 15 * MINUTE_MS, width_quarters * 15 * MINUTE_MS);
        let mut states = Vec::new();
        for i in 0..timeline.set.gpus.len() {
            timeline.states(i, from, width, buckets, &mut states);
            let alone: Vec<GpuState> = (0..buckets as i64)
                .map(|b| timeline.state(i, Window { starts_at: from + b * width, ends_at: from + (b + 1) * width }))
                .collect();
            proptest::prop_assert_eq!(&states, &alone, "GPU {}", i);
        }
    }
}
