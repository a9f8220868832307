//! External ResourceSync topics: a static Change List on a plain file server becomes push
//! notifications; Change List Indexes are followed; fat pings from a resourcesync_push-style
//! publisher are distributed; the admin API lists topics and redelivers from a seq.

use crate::common::*;
use crate::topics::{change_list, change_list_index, entries, locs, Doc, TopicServer};
use reqwest::StatusCode;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(15);

async fn ping(hub: &TestHub, topic: &str) {
    let (status, text) = hub
        .hub_request(&[("hub.mode", "publish"), ("hub.url", topic)])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
}

async fn subscribe(hub: &TestHub, topic: &str, receiver: &Receiver) {
    let (status, text) = hub
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", &receiver.url),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{text}");
    hub.wait_subscribed(&receiver.url).await;
}

/// Every delivered loc, in order.
fn delivered_locs(r: &Receiver) -> Vec<String> {
    r.delivered().iter().flat_map(|p| locs(&p.body)).collect()
}

fn xml(body: String) -> Doc {
    Doc::new(body, "application/xml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_change_list_becomes_notifications() {
    let files = TopicServer::start().await;
    let prefix = files.prefix();
    let mut hub = TestHub::start(move |c| c.allow_external_topics = vec![prefix]).await;
    let topic = files.url("/dataset/changelist.xml");
    let mut all = entries("res", 0, 6);
    files.put("/dataset/changelist.xml", xml(change_list(&all[..3])));
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe(&hub, &topic, &receiver).await;

    // First ping: everything is new to the subscriber.
    ping(&hub, &topic).await;
    receiver.wait_seq(3, WAIT).await;
    let expect = |es: &[crate::topics::Entry]| es.iter().map(|e| e.loc.clone()).collect::<Vec<_>>();
    assert_eq!(delivered_locs(&receiver), expect(&all[..3]));
    let first = &receiver.delivered()[0];
    assert_eq!(first.header("content-type"), Some("application/xml"));
    let link = first.header("link").unwrap();
    assert!(link.contains(&format!("<{topic}>; rel=\"self\"")), "{link}");
    // The notification's rel="up" leads to a Capability List of the mirror, whose Change List
    // is served with the external topic as rel="self".
    let (header, _) =
        changehub::resourcesync::parse_change_list(&first.body, &big_limits()).unwrap();
    let up = &header.links.iter().find(|l| l.rel == "up").unwrap().href;
    let cap = hub.client.get(up).send().await.unwrap();
    assert_eq!(cap.status(), 200, "{up}");
    let cap = cap.bytes().await.unwrap();
    let changelist = match changehub::resourcesync::parse_document(&cap, &big_limits()).unwrap() {
        changehub::resourcesync::Document::CapabilityList { caps, .. } => caps[0].loc.clone(),
        other => panic!("not a capability list: {other:?}"),
    };
    let mirror = hub.client.get(&changelist).send().await.unwrap();
    assert_eq!(mirror.status(), 200);
    let mirror_link = mirror.headers()["link"].to_str().unwrap().to_string();
    assert!(
        mirror_link.contains(&format!("<{topic}>; rel=\"self\"")),
        "{mirror_link}"
    );
    let (_, mirrored) =
        changehub::resourcesync::parse_change_list(&mirror.bytes().await.unwrap(), &big_limits())
            .unwrap();
    assert_eq!(mirrored.len(), 3);

    // Changes appended to the file, then a ping: exactly the new ones.
    files.put("/dataset/changelist.xml", xml(change_list(&all[..5])));
    ping(&hub, &topic).await;
    receiver.wait_seq(5, WAIT).await;
    assert_eq!(delivered_locs(&receiver), expect(&all[..5]));
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3, 4, 5]);

    // A ping with nothing new distributes nothing; the next change still arrives alone.
    ping(&hub, &topic).await;
    wait_until("unchanged list fetched", WAIT, || async {
        files.gets("/dataset/changelist.xml") == 3
    })
    .await;
    files.put("/dataset/changelist.xml", xml(change_list(&all[..6])));
    ping(&hub, &topic).await;
    receiver.wait_seq(6, WAIT).await;
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(
        receiver.delivered().len(),
        3,
        "one notification per ping with news"
    );

    // The hub remembers what it has seen across a restart.
    hub.stop().await;
    let dir = hub.data_dir.clone();
    let prefix = files.prefix();
    let hub2 = TestHub::start_in(dir, move |c| c.allow_external_topics = vec![prefix]).await;
    hub2.wait_subscribed(&receiver.url).await;
    all.extend(entries("more", 100, 1));
    files.put("/dataset/changelist.xml", xml(change_list(&all)));
    ping(&hub2, &topic).await;
    receiver.wait_seq(7, WAIT).await;
    let last = receiver.delivered().last().unwrap().clone();
    assert_eq!(locs(&last.body), vec![all[6].loc.clone()]);
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3, 4, 5, 6, 7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_list_index_is_followed() {
    let files = TopicServer::start().await;
    let prefix = files.prefix();
    let hub = TestHub::start(move |c| c.allow_external_topics = vec![prefix]).await;
    let topic = files.url("/changelist-index.xml");
    let old = entries("old", 0, 2);
    let open = entries("new", 10, 2);
    files.put("/cl1.xml", xml(change_list(&old)));
    files.put("/cl2.xml", xml(change_list(&open)));
    files.put(
        "/changelist-index.xml",
        xml(change_list_index(&[
            (
                files.url("/cl1.xml"),
                "2024-05-01T10:00:00Z",
                Some("2024-05-01T10:00:05Z"),
            ),
            (files.url("/cl2.xml"), "2024-05-01T10:00:05Z", None),
        ])),
    );
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe(&hub, &topic, &receiver).await;
    ping(&hub, &topic).await;
    receiver.wait_seq(4, WAIT).await;
    let want: Vec<_> = old.iter().chain(&open).map(|e| e.loc.clone()).collect();
    assert_eq!(delivered_locs(&receiver), want);

    // The closed list is not read again once the hub is past it.
    let more = entries("new", 10, 3);
    files.put("/cl2.xml", xml(change_list(&more)));
    ping(&hub, &topic).await;
    receiver.wait_seq(5, WAIT).await;
    assert_eq!(delivered_locs(&receiver).last(), Some(&more[2].loc));
    assert_eq!(files.gets("/cl1.xml"), 1);
    assert_eq!(files.gets("/cl2.xml"), 2);
}

/// The seed-era ResourceSync PubSubHubbub publisher: POST the Change List to `/publish` with
/// `Content-Type: application/xml` and `Link: <topic>;rel=self, <hub>;rel=hub`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fat_pings_are_distributed() {
    let hub =
        TestHub::start(|c| c.allow_external_topics = vec!["http://source.example/".into()]).await;
    let topic = "http://source.example/rs/changelist.xml";
    let receiver = Receiver::start(Behaviour::default()).await;
    let signed = Receiver::start(Behaviour::default()).await;
    subscribe(&hub, topic, &receiver).await;
    let (status, _) = hub
        .hub_request(&[
            ("hub.mode", "subscribe"),
            ("hub.topic", topic),
            ("hub.callback", &signed.url),
            ("hub.secret", "fat-secret"),
        ])
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    hub.wait_subscribed(&signed.url).await;

    let fat = |body: String, links: Vec<String>, path: &str| {
        let mut req = hub
            .client
            .post(format!("{}{path}", hub.url))
            .header("content-type", "application/xml")
            .body(body);
        for l in links {
            req = req.header("link", l);
        }
        req.send()
    };
    let first = entries("fat", 0, 2);
    let resp = fat(
        change_list(&first),
        vec![format!("<{topic}>;rel=self, <{}/hub>;rel=hub", hub.url)],
        "/publish",
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let answer: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(answer["new"], 2, "{answer}");
    receiver.wait_seq(2, WAIT).await;
    signed.wait_seq(2, WAIT).await;
    let n = &signed.delivered()[0];
    assert!(changehub::model::signature::verify(
        n.header("x-hub-signature").unwrap(),
        b"fat-secret",
        &n.body
    ));
    assert_eq!(
        delivered_locs(&receiver),
        vec![first[0].loc.clone(), first[1].loc.clone()]
    );

    // The same document again plus one change, as two Link headers with quoted rels, on /hub.
    let second = entries("fat", 0, 3);
    let resp = fat(
        change_list(&second),
        vec![
            format!("<{}/hub>; rel=\"hub\"", hub.url),
            format!("<{topic}>; rel=\"self\""),
        ],
        "/hub",
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    receiver.wait_seq(3, WAIT).await;
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3]);
    assert_eq!(
        locs(&receiver.delivered()[1].body),
        vec![second[2].loc.clone()]
    );

    // Refusals, each with a reason.
    let cases = [
        (
            "<urlset>broken".to_string(),
            vec![format!("<{topic}>; rel=self")],
            StatusCode::BAD_REQUEST,
            "Change List",
        ),
        (
            change_list(&second),
            vec![],
            StatusCode::BAD_REQUEST,
            "rel=self",
        ),
        (
            change_list(&second),
            vec!["<http://other.example/cl.xml>; rel=self".to_string()],
            StatusCode::FORBIDDEN,
            "allow",
        ),
        (
            change_list(&second),
            vec![format!("<{}>; rel=self", hub.topic())],
            StatusCode::FORBIDDEN,
            "token",
        ),
    ];
    for (body, links, status, reason) in cases {
        let resp = fat(body, links, "/hub").await.unwrap();
        assert_eq!(resp.status(), status);
        let text = resp.text().await.unwrap();
        assert!(text.contains(reason), "{text}");
    }
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_lists_topics_and_redelivers_from_a_seq() {
    let files = TopicServer::start().await;
    let prefix = files.prefix();
    let hub = TestHub::start(move |c| c.allow_external_topics = vec![prefix]).await;
    let topic = files.url("/cl.xml");
    files.put("/cl.xml", xml(change_list(&entries("r", 0, 4))));
    let receiver = Receiver::start(Behaviour::default()).await;
    subscribe(&hub, &topic, &receiver).await;
    ping(&hub, &topic).await;
    receiver.wait_seq(4, WAIT).await;

    let api = |path: &str| format!("{}/api/{path}", hub.url);
    let channels: Vec<serde_json::Value> = hub
        .client
        .get(api("channels"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(channels.len(), 2, "{channels:?}");
    assert_eq!(channels[0]["kind"], "hosted");
    let ext = &channels[1];
    assert_eq!(ext["kind"], "external");
    assert_eq!(ext["topic"], topic);
    assert_eq!(ext["content"], "changelist");
    assert_eq!(ext["last"], 4);

    // The external topic's log serves catch-up like a channel's.
    let ext_name = ext["name"].as_str().unwrap();
    let page = hub
        .client
        .get(format!("{}/channels/{ext_name}/changes?after=1", hub.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let link = page.headers()["link"].to_str().unwrap().to_string();
    assert!(link.contains(&format!("<{topic}>; rel=\"self\"")), "{link}");
    let (_, caught_up) =
        changehub::resourcesync::parse_change_list(&page.bytes().await.unwrap(), &big_limits())
            .unwrap();
    let seqs: Vec<_> = caught_up.iter().map(|e| e.seq.unwrap()).collect();
    assert_eq!(seqs, vec![2, 3, 4]);

    // The receiver has the changes; the hub records the cursor right after the 2xx.
    wait_until("delivery state saved", WAIT, || async {
        hub.subscriptions().await[0]["cursor"] == 4
    })
    .await;
    let subs = hub.subscriptions().await;
    let sub = &subs[0];
    assert_eq!(
        receiver.delivered()[0].header("x-changehub-channel"),
        Some(ext_name)
    );
    assert_eq!(sub["external"], true);
    assert_eq!(sub["verified"], true);
    assert_eq!(sub["cursor"], 4);
    assert_eq!(sub["lag"], 0);
    assert!(sub["last_success"].is_string());
    assert!(sub.get("secret").is_none());
    let id = sub["id"].as_str().unwrap().to_string();

    // Redeliver from seq 2: changes 2, 3, 4 arrive again.
    let redeliver = format!("subscriptions/{id}/redeliver");
    let resp = hub
        .client
        .post(api(&format!("{redeliver}?from=2")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    receiver
        .wait_for("redelivery", WAIT, |r| r.delivered_seqs().len() >= 7)
        .await;
    assert_eq!(receiver.delivered_seqs(), vec![1, 2, 3, 4, 2, 3, 4]);

    // A JSON body works too; bad requests are refused.
    let resp = hub
        .client
        .post(api(&redeliver))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"from": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    receiver
        .wait_for("second redelivery", WAIT, |r| r.delivered_seqs().len() >= 8)
        .await;
    assert_eq!(receiver.delivered_seqs()[7..], [4]);
    for (query, status) in [
        ("?from=0", StatusCode::BAD_REQUEST),
        ("?from=x", StatusCode::BAD_REQUEST),
        ("?from=99", StatusCode::BAD_REQUEST),
    ] {
        let resp = hub
            .client
            .post(api(&format!("{redeliver}{query}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{query}");
    }
    let resp = hub
        .client
        .post(api("subscriptions/nope/redeliver?from=1"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = hub
        .client
        .post(api(&format!("{redeliver}?from=1")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);

    // Removal through the admin API ends deliveries.
    let resp = hub
        .client
        .delete(api(&format!("subscriptions/{id}")))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    assert!(hub.subscriptions().await.is_empty());
}
