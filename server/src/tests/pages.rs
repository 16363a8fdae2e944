//! Pages as a browser gets them from the server: what answers 404, and that pages answer
//! while another Berth starts in the same process.

use berth_domain::policy::Role;
use berth_domain::tenancy::Isolation;
use http::StatusCode;

use super::Berth;

#[tokio::test]
async fn the_launch_page_of_an_offering_that_does_not_exist_is_not_found() {
    let berth = Berth::start(None).await;
    let tenant = berth.platform.ensure_tenant("tenant-a", "Tenant A", Isolation::Soft).await.expect("tenant");
    berth.person("dana@example.com", Role::Member, Some(tenant)).await;
    let cookie = berth.sign_in("dana@example.com", None).await;
    let known = berth.get("/launch/notebook", Some(&cookie)).await;
    assert_eq!(known.status, StatusCode::OK);
    assert!(known.body.contains("Launch a Jupyter notebook"), "the form");
    let unknown = berth.get("/launch/quantum-annealer", Some(&cookie)).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert!(unknown.body.contains("Page not found"), "the not-found page");
}

/// Building Berth's router walks the app once with resource loading suspended, and Leptos
/// suspends it for the whole process: a page whose data is first asked for in that moment
/// would wait forever. Another Berth starting beside this one (the tests do, two at a time)
/// must not stall this one's pages.
#[tokio::test]
async fn pages_answer_while_another_berth_starts() {
    let berth = Berth::start(None).await;
    let starting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let others = std::thread::spawn({
        let starting = starting.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            for _ in 0..40 {
                drop(runtime.block_on(Berth::start(None)));
            }
            starting.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let mut pages = 0;
    while starting.load(std::sync::atomic::Ordering::Relaxed) {
        let page = berth.get_within("/login", None, std::time::Duration::from_secs(10)).await;
        assert_eq!(page.status, StatusCode::OK);
        pages += 1;
    }
    others.join().expect("the other Berths started");
    assert!(pages > 0);
}
