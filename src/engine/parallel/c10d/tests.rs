//! Tests of the job's store and Gloo group (src/engine/parallel/c10d.rs): ranks on threads of one process.

use super::*;

#[test]
fn ranks_meet_in_the_tcp_store_and_sum_and_broadcast_through_gloo() {
    let port = free_port();
    let world = 3u32;
    let results: Vec<(Vec<f32>, Vec<f32>, i64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn(move || {
                    let t = Duration::from_secs(20);
                    let store =
                        JobStore::connect("127.0.0.1", port, rank == 0, world, t, "test/").unwrap();
                    store.set(&format!("hello/{rank}"), b"hi").unwrap();
                    let arrived = store.add("arrived", 1).unwrap();
                    assert!(arrived >= 1);
                    let mut g = GlooGroup::new(&store, rank, world, t).unwrap();
                    let mut sum = Tensor::from_slice(&[rank as f32, 1.0]);
                    g.all_reduce_sum(&mut sum).unwrap();
                    let mut b = Tensor::from_slice(&[10.0 + rank as f32]);
                    g.broadcast(&mut b, 1).unwrap();
                    while store.add("arrived", 0).unwrap() < world as i64 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let seen = (0..world)
                        .filter(|r| store.try_get(&format!("hello/{r}")).unwrap().is_some())
                        .count() as i64;
                    // The host keeps the store until every rank read it.
                    store.add("read", 1).unwrap();
                    while rank == 0 && store.add("read", 0).unwrap() < world as i64 {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    (
                        Vec::<f32>::try_from(&sum).unwrap(),
                        Vec::<f32>::try_from(&b).unwrap(),
                        seen,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (sum, b, seen) in results {
        assert_eq!(sum, vec![3.0, 3.0], "0+1+2 and 1+1+1");
        assert_eq!(b, vec![11.0], "rank 1's value everywhere");
        assert_eq!(seen, 3, "every rank's key in the store");
    }
}

#[test]
fn a_missing_store_host_is_an_error_not_a_hang() {
    let port = free_port();
    let t0 = std::time::Instant::now();
    let r = JobStore::connect(
        "127.0.0.1",
        port,
        false,
        2,
        Duration::from_millis(1500),
        "x/",
    );
    assert!(r.is_err(), "nobody hosts the store");
    assert!(t0.elapsed() < Duration::from_secs(30));
}
